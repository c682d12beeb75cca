"""The unit of work's writer on SQLite (the ViewWriter port): every row is written through
the views' connection inside the transaction SqliteViews.unit_of_work opened
(adapters/sqlite/views.py), except the mailbox shards, buffered for the store to write and
make durable before that transaction commits (as adapters/cassandra/writer.py buffers a
unit of work's rows for the Cassandra views' rounds)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from projections.ports import LogPosition, MessageRefs
from projections.rows import (
    DELIVERY_RECORD,
    HEAD_COLUMNS,
    MESSAGE_COLUMNS,
    STATE_COLUMNS,
    DeliveryRecord,
    MessageRow,
    delivery_cells,
    head_cells,
    message_cells,
)
from projections.state import UserConversationState


class SqliteWriter:
    """The ViewWriter of one unit of work. Mailbox shards are buffered and written
    by the store before the views transaction commits."""

    def __init__(self, con: sqlite3.Connection, targets: frozenset[str]) -> None:
        self.con = con
        self.targets = targets
        self.mailbox: list[tuple[str, MessageRefs]] = []
        self.mailbox_entries = 0
        self.deliveries: list[tuple[str, str, int]] = []
        self.positions: dict[tuple[str, int], int] = {}
        self.log_positions: dict[int, LogPosition] = {}
        self.partition = 0  # one log, one partition
        self.head_keys: set[tuple[str, str]] = set()  # the heads put (heads_written)

    def applying(self, partition: int, above: int) -> None:
        """`above` is unused here: a mailbox read is one index range (ADR-0045 is Cassandra's)."""
        self.partition = partition

    def track(self, projection: str, position: int, partition: int = 0) -> None:
        """Record the last position this unit of work applied for (projection, partition);
        written after everything else of the unit, in the same commit."""
        self.positions[(projection, partition)] = position

    def track_log(self, partition: int, position: int, next_offset: int) -> None:
        self.log_positions[partition] = LogPosition(position, next_offset)

    def finish(self, now: float) -> None:
        """The unit's last rows, once the mailbox store holds its entries: the delivery
        records' materialized_at, the last message whose entries it wrote (what the mailbox
        must hold with these views, checked at start: ADR-0056), the tracking positions."""
        if self.deliveries:
            self.con.executemany(
                "UPDATE delivery SET materialized_at=? WHERE tenant=? AND conversation_id=? AND conversation_seq=?",
                [(now, *d) for d in self.deliveries],
            )
        if self.mailbox:
            self.con.execute("INSERT OR REPLACE INTO mailbox_written VALUES (0, ?)", (self.mailbox[-1][1].pos,))
        self.con.executemany(
            "INSERT INTO tracking VALUES (?, ?, ?) "
            "ON CONFLICT(projection, partition) DO UPDATE SET position=excluded.position",
            [(name, partition, pos) for (name, partition), pos in self.positions.items()],
        )
        self.con.executemany(
            "INSERT OR REPLACE INTO log_positions VALUES (?, ?, ?)",
            [(partition, *lp) for partition, lp in self.log_positions.items()],
        )

    def heads_written(self) -> Iterable[tuple[str, str]]:
        return self.head_keys

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, Any], *, lookups: bool = True) -> None:
        # the lookups are indexes of this one row: written with it, whatever `lookups` says
        if "heads" not in self.targets:
            return
        self.head_keys.add((tenant, conversation_id))
        self.con.execute(
            f"INSERT OR REPLACE INTO heads (tenant, conversation_id, {', '.join(HEAD_COLUMNS)}) "
            f"VALUES (?, ?, {', '.join('?' * len(HEAD_COLUMNS))})",
            (tenant, conversation_id, *head_cells(head)),
        )

    def put_message(self, tenant: str, conversation_id: str, m: MessageRow) -> None:
        if "heads" not in self.targets:
            return
        self.con.execute(
            f"INSERT OR REPLACE INTO messages (tenant, {', '.join(MESSAGE_COLUMNS)}) "
            f"VALUES (?, {', '.join('?' * len(MESSAGE_COLUMNS))})",
            (tenant, *message_cells(m)),
        )

    def put_mailbox(self, tenant: str, refs: MessageRefs) -> None:
        if "mailbox" not in self.targets or not refs.shards:
            return
        self.mailbox.append((tenant, refs))
        self.mailbox_entries += sum(len(b) for b in refs.shards.values())

    def put_states(
        self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]
    ) -> None:
        if "state" not in self.targets:
            return
        self.con.executemany(
            f"INSERT OR REPLACE INTO states (tenant, user_id, conversation_id, {', '.join(STATE_COLUMNS)}) "
            f"VALUES (?, ?, ?, {', '.join('?' * len(STATE_COLUMNS))})",
            [(tenant, u, conversation_id, *s.row().values()) for u, s in states],
        )

    def put_gaps(self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]) -> None:
        """Only the gap columns, updated in place: the burst of a policy switch."""
        if "state" not in self.targets:
            return
        self.con.executemany(
            "UPDATE states SET delivered_conversation_seq=?, skipping=?, gap_end=? "
            "WHERE tenant=? AND user_id=? AND conversation_id=?",
            [(s.delivered_conversation_seq, s.skipping, s.gap_end, tenant, u, conversation_id) for u, s in states],
        )

    def delete_state(self, tenant: str, conversation_id: str, user_id: str) -> None:
        if "state" not in self.targets:
            return
        self.con.execute(
            "DELETE FROM states WHERE tenant=? AND user_id=? AND conversation_id=?", (tenant, user_id, conversation_id)
        )

    def put_activity(
        self, tenant: str, conversation_id: str, user_ids: Sequence[str], bucket: int, previous: int | None
    ) -> None:
        """No login index here: the login read is one statement over states and heads (ADR-0028)."""

    def delete_activity(self, tenant: str, conversation_id: str, user_id: str, bucket: int) -> None:
        """No login index here (put_activity)."""

    def put_delivery(self, tenant: str, conversation_id: str, seq: int, r: DeliveryRecord) -> None:
        if "heads" not in self.targets:
            return
        self.con.execute(  # the runtime facts start NULL (REPLACE deletes the row it replaces)
            f"INSERT OR REPLACE INTO delivery (tenant, conversation_id, conversation_seq, {', '.join(DELIVERY_RECORD)}) "
            f"VALUES (?, ?, ?, {', '.join('?' * len(DELIVERY_RECORD))})",
            (tenant, conversation_id, seq, *delivery_cells(r)),
        )
        self.deliveries.append((tenant, conversation_id, seq))

    def put_review(self, review: dict[str, Any]) -> None:
        if "heads" not in self.targets:
            return
        self.con.execute(
            "INSERT OR REPLACE INTO reviews VALUES (?,?,?)", (review["review_id"], review["tenant"], json.dumps(review))
        )

    def put_tier(self, tier: dict[str, Any]) -> None:
        if "heads" not in self.targets:
            return
        old = self.con.execute("SELECT body FROM tiers WHERE tier_id=?", (tier["tier_id"],)).fetchone()
        body = json.loads(old[0]) if old else {}
        body.update(tier)
        self.con.execute("INSERT OR REPLACE INTO tiers VALUES (?,?)", (tier["tier_id"], json.dumps(body)))

    def put_capacity(self, name: str, body: dict[str, Any]) -> None:
        self.con.execute("INSERT OR REPLACE INTO capacity VALUES (?,?)", (name, json.dumps(body)))
