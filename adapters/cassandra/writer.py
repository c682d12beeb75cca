"""The write side of the Cassandra views: `CassandraWriter`, the ViewWriter of one unit of
work, which buffers every write (the last one per key wins, as it would in order) as the
cells the commit will send, and turns them into the rows of the commit's rounds
(`CassandraViews._commit`, ADR-0025); the state rows' codec (its "no value" NO_SEQ is
session_states.py's) and round B's batching (`conversation_batches`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cassandra.query import BatchStatement, PreparedStatement

from adapters.cassandra.batches import Encoded, Row, batch_of, bound
from adapters.cassandra.mailbox_floors import floor_row, floor_statement
from adapters.cassandra.session_heads import session_head_rows
from adapters.cassandra.session_states import NO_SEQ, paired, session_cell
from adapters.cassandra.stamps import stamp
from projections.ports import MessageRefs
from projections.rows import (
    STATE_COLUMNS,
    DeliveryRecord,
    MessageRow,
    delivery_cells,
    head_cells,
    message_cells,
)
from projections.state import SessionState, UserConversationState

BATCH_ROWS = 100  # rows per UNLOGGED batch
MEMBER_BATCH_ROWS = 250  # rows per batch of round A (member-keyed rows: one partition each)
# Round B: a batch holds whole conversations (rows and head: one mutation each), at most this many
# rows and about this many bytes (Cassandra warns above batch_size_warn_threshold, 64 KiB here)
CONVERSATION_BATCH_ROWS = 250
CONVERSATION_BATCH_BYTES = 60 * 1024
ROW_BYTES = 330  # a row's size without its text as Cassandra counts it for that warning (PERFORMANCE.md 34)

_NULLABLE_SEQS = ("delivered_conversation_seq", "gap_end")


def seq_cell(value: int | None) -> int:
    return NO_SEQ if value is None else value


def state_cells(state: UserConversationState) -> tuple[Any, ...]:
    row = state.row()
    for c in _NULLABLE_SEQS:
        row[c] = seq_cell(row[c])
    return tuple(row.values())


def state_row(r: Any) -> dict[str, Any]:
    """A stored state row with its sentinels read back as None."""
    row = {c: r[c] for c in STATE_COLUMNS}
    for c in _NULLABLE_SEQS:
        if row[c] == NO_SEQ:
            row[c] = None
    return row


# What the login reads of a state row (projections/state.py SessionState), in this order after
# the conversation id: the columns `session_state` turns into a SessionState.
SESSION_STATE_COLUMNS = (
    "read_conversation_seq",
    "delivered_conversation_seq",
    "skipping",
    "gap_end",
    "rebuilt_seq",
    "mention_seqs",
    "broadcast_base",
)


def session_state(r: Sequence[Any]) -> SessionState:
    """The SessionState of a stored row of SESSION_STATE_COLUMNS (a tuple), without the
    whole UserConversationState: a login reads thousands of these. The same values as
    `SessionState.of(UserConversationState.from_row(state_row(row)))`."""
    read, delivered, skipping, gap_end, rebuilt, mentions, base = r
    return SessionState(
        read,
        None if delivered == NO_SEQ else delivered,
        bool(skipping),
        None if gap_end == NO_SEQ else gap_end,
        rebuilt,
        mentions.count(",") + 1 if mentions else 0,
        base,
    )


SizedRow = tuple[PreparedStatement, tuple[Any, ...], int]  # a statement, its values, its estimated bytes


@dataclass
class ConversationRows:
    """One conversation's rows of a unit of work (round B of the commit)."""

    rows: list[SizedRow] = field(default_factory=list)  # member states, messages, broadcasts, delivery records
    head: SizedRow | None = None


def conversation_batches(
    conversations: Iterable[ConversationRows], keyspace: str
) -> tuple[list[tuple[BatchStatement, None]], list[tuple[BatchStatement, None]]]:
    """Round B's batches. Each conversation's rows and its head go in ONE batch: one partition
    key, so one mutation, applied atomically. Several conversations share a batch up to
    CONVERSATION_BATCH_ROWS rows and CONVERSATION_BATCH_BYTES. A conversation too large for one
    batch (a large join, a burst of long messages) sends its first rows ahead in chunks (`early`,
    written before any head); its last chunk rides with its head in `final`. (batches.bound, ADR-0053)"""
    early: list[tuple[BatchStatement, None]] = []
    final: list[tuple[BatchStatement, None]] = []
    batch: list[Encoded] = []  # `final`'s batch being filled, `size` its bytes
    size = 0
    for x in conversations:
        rows = [*x.rows, *([x.head] if x.head is not None else [])]
        tail, tail_bytes = len(rows), 0  # the rows that fit in one batch with the head, from the end
        while tail > 0 and len(rows) - tail < CONVERSATION_BATCH_ROWS:
            if tail_bytes + rows[tail - 1][2] > CONVERSATION_BATCH_BYTES and tail < len(rows):
                break
            tail -= 1
            tail_bytes += rows[tail][2]
        ahead, rows = rows[:tail], rows[tail:]
        chunk, chunk_bytes = list[Encoded](), 0
        for stmt, args, b in ahead:
            if chunk and (len(chunk) == CONVERSATION_BATCH_ROWS or chunk_bytes + b > CONVERSATION_BATCH_BYTES):
                early.append((batch_of(chunk, keyspace), None))
                chunk, chunk_bytes = [], 0
            chunk.append(bound(stmt, args))
            chunk_bytes += b
        if chunk:
            early.append((batch_of(chunk, keyspace), None))
        if batch and (len(batch) + len(rows) > CONVERSATION_BATCH_ROWS or size + tail_bytes > CONVERSATION_BATCH_BYTES):
            final.append((batch_of(batch, keyspace), None))
            batch, size = [], 0
        batch.extend(bound(stmt, args) for stmt, args, _ in rows)
        size += tail_bytes
    if batch:
        final.append((batch_of(batch, keyspace), None))
    return early, final


class CassandraWriter:
    """The ViewWriter of one unit of work: every write is buffered (the last one per key
    wins, as it would in order), executed by the store when the block exits cleanly."""

    def __init__(self, targets: frozenset[str], checkpoint: Callable[[str], None] | None = None) -> None:
        self.targets = targets
        self.partition = 0  # where the writes come from now, and what they are above (`applying`)
        self.above = 0
        self.floors: dict[tuple[str, str], int] = {}  # (tenant, user) -> the lowest `above` of its puts (ADR-0045)
        self.mailbox: list[tuple[str, MessageRefs]] = []
        self.mailbox_entries = self.largest_message = 0  # entries in all, and in its largest message
        self.positions: dict[tuple[str, int], int] = {}
        self.log_positions: dict[int, tuple[int, int]] = {}  # partition -> (position, next offset)
        self.checkpoint = checkpoint  # between the commit's steps (ViewStore.unit_of_work)
        self.heads: dict[tuple[str, str], tuple[tuple[Any, ...], int]] = {}  # (its cells, its bytes)
        self.lookups: dict[tuple[str, str], tuple[str, str]] = {}  # -> (aggregate id, size bucket): ADR-0049
        # (its cells, a broadcast?, its bytes)
        self.messages: dict[tuple[str, str, int], tuple[tuple[Any, ...], bool, int]] = {}
        self.deliveries: dict[tuple[str, str, int], dict[str, Any]] = {}
        # (tenant, conversation_id, user_id) -> ("put", [its cells]) | ("gap", (delivered, skipping,
        # gap_end, the login copy's cell)) | ("delete", None)
        self.states: dict[tuple[str, str, str], tuple[str, Any]] = {}
        # the login index: (tenant, user_id, conversation_id) -> (the bucket its row goes to, or
        # None; the buckets whose rows are deleted)
        self.activity: dict[tuple[str, str, str], tuple[int | None, frozenset[int]]] = {}
        self.reviews: dict[str, dict[str, Any]] = {}
        self.tiers: dict[str, dict[str, Any]] = {}
        self.capacity: dict[str, dict[str, Any]] = {}
        # A unit may span log partitions (the worker's take): each row is stamped with the
        # position ITS partition reaches in the unit (ADR-0021: a row's stamps grow with its own
        # partition's log), the partition `applying` named when it was put.
        self.partition_of: dict[tuple[str, ...], int] = {}

    def applying(self, partition: int, above: int) -> None:
        self.partition, self.above = partition, above

    def _from(self, *key: str) -> None:
        self.partition_of[key] = self.partition

    def stamp_of(self, *key: str) -> int:
        """The write stamp of the rows put under `key` ((tenant, conversation_id), ("review",
        id), ("tier", id), ("capacity", name)): the stamp of the position their partition
        reaches in this unit; the unit's stamp when that partition tracks nothing here."""
        partition = self.partition_of.get(key)
        tops = [pos for (_, p), pos in self.positions.items() if p == partition]
        if partition in self.log_positions:
            tops.append(self.log_positions[partition][0])
        return stamp(max(tops)) if tops else self.stamp()

    def track(self, projection: str, position: int, partition: int = 0) -> None:
        self.positions[(projection, partition)] = position

    def track_log(self, partition: int, position: int, next_offset: int) -> None:
        self.log_positions[partition] = (position, next_offset)

    def stamp(self) -> int:
        """The write timestamp of this unit's rows: its log position's stamp; a unit that
        tracks no position (not from the log) gets the wall clock, below every stamp."""
        top = max([*self.positions.values(), *(p for p, _ in self.log_positions.values())], default=None)
        return stamp(top) if top is not None else time.time_ns() // 1000

    def step(self, name: str) -> None:
        if self.checkpoint is not None:
            self.checkpoint(name)

    def put_capacity(self, name: str, body: dict[str, Any]) -> None:
        self.capacity[name] = json_body(body)
        self._from("capacity", name)

    # A put takes the row's cells at once: the projection goes on changing its working set
    # (the same dicts and states) for the next events of the unit. Cells are what the commit
    # writes anyway, and cheaper than the deep copies they replace (~30% of a worker's CPU on
    # small groups: docs/PERFORMANCE.md section 14).

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, Any], *, lookups: bool = True) -> None:
        if "heads" in self.targets:
            text = f"{head.get('title') or ''}{head.get('preview') or ''}"
            self.heads[(tenant, conversation_id)] = (head_cells(head), ROW_BYTES + len(text.encode()))
            if lookups:
                self.lookups[(tenant, conversation_id)] = (str(head["aggregate_id"]), head["size_bucket"])
            self._from(tenant, conversation_id)

    def heads_written(self) -> Iterable[tuple[str, str]]:
        return self.heads.keys()

    def put_message(self, tenant: str, conversation_id: str, message: MessageRow) -> None:
        if "heads" in self.targets:
            broadcast = bool(message["mention_all"] or message["announcement"])
            size = ROW_BYTES + len(message["text"].encode())
            self.messages[(tenant, conversation_id, message["conversation_seq"])] = (
                message_cells(message),
                broadcast,
                size,
            )
            self._from(tenant, conversation_id)

    def put_mailbox(self, tenant: str, refs: MessageRefs) -> None:
        if "mailbox" not in self.targets or not refs.shards:
            return
        self.mailbox.append((tenant, refs))
        entries = sum(len(b) for b in refs.shards.values())
        self.mailbox_entries, self.largest_message = self.mailbox_entries + entries, max(self.largest_message, entries)

    def put_states(
        self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]
    ) -> None:
        if "state" in self.targets:
            self._from(tenant, conversation_id)
            for u, s in states:
                self.states[(tenant, conversation_id, u)] = ("put", list(state_cells(s)))
                self.floors[(tenant, u)] = min(self.above, self.floors.get((tenant, u), self.above))

    def put_gaps(self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]) -> None:
        if "state" not in self.targets:
            return
        self._from(tenant, conversation_id)
        for u, s in states:
            key = (tenant, conversation_id, u)
            queued = self.states.get(key)
            if queued is not None and queued[0] == "put":  # a row written in this unit: update it here
                cells = queued[1]
                cells[_DELIVERED], cells[_SKIPPING], cells[_GAP_END] = (
                    seq_cell(s.delivered_conversation_seq),
                    int(s.skipping),
                    seq_cell(s.gap_end),
                )
            elif queued is None or queued[0] == "gap":
                gap = (s.delivered_conversation_seq, int(s.skipping), s.gap_end, session_cell(SessionState.of(s)))
                self.states[key] = ("gap", gap)
            # a row deleted in this unit stays deleted (a gap update touches existing rows only)

    def delete_state(self, tenant: str, conversation_id: str, user_id: str) -> None:
        if "state" in self.targets:
            self.states[(tenant, conversation_id, user_id)] = ("delete", None)
            self._from(tenant, conversation_id)

    def put_activity(
        self, tenant: str, conversation_id: str, user_ids: Sequence[str], bucket: int, previous: int | None
    ) -> None:
        if "state" not in self.targets:
            return
        self._from(tenant, conversation_id)
        for u in user_ids:
            key = (tenant, u, conversation_id)
            _, drops = self.activity.get(key, (None, frozenset()))
            if previous is not None:  # (a row that is not there costs one tombstone)
                drops = drops | {previous}
            self.activity[key] = (bucket, drops - {bucket})

    def delete_activity(self, tenant: str, conversation_id: str, user_id: str, bucket: int) -> None:
        if "state" in self.targets:
            self._from(tenant, conversation_id)
            key = (tenant, user_id, conversation_id)
            queued, drops = self.activity.get(key, (None, frozenset()))
            self.activity[key] = (None, drops | {bucket} | ({queued} if queued is not None else set()))

    def put_delivery(self, tenant: str, conversation_id: str, seq: int, record: DeliveryRecord) -> None:
        if "heads" in self.targets:
            self.deliveries[(tenant, conversation_id, seq)] = dict(record)
            self._from(tenant, conversation_id)

    def put_review(self, review: dict[str, Any]) -> None:
        if "heads" in self.targets:
            r = json_body(review)
            self.reviews.pop(r["review_id"], None)  # the one written last goes last
            self.reviews[r["review_id"]] = r
            self._from("review", r["review_id"])

    def put_tier(self, tier: dict[str, Any]) -> None:
        if "heads" in self.targets:
            t = json_body(tier)
            self.tiers.setdefault(t["tier_id"], {}).update(t)
            self._from("tier", t["tier_id"])

    # -- the rows of the commit ------------------------------------------------------------

    def rows(
        self, ps: Mapping[str, PreparedStatement], ts_of: Callable[..., int]
    ) -> tuple[list[Row], dict[tuple[str, str], ConversationRows]]:
        """The member-keyed state rows (round A), each with its login copy's (ADR-0043:
        one run, so one mutation) and, with the user's first put of the unit, the user's
        mailbox floor (ADR-0045: the same partition key, the same mutation), and each
        conversation's rows (round B)."""
        members: list[Row] = []
        copy = ps["session_state"]
        floor_id = ps["floor"].query_id
        floors = dict(self.floors)  # popped as written: one a user
        convs: dict[tuple[str, str], ConversationRows] = {}

        def conv(t: str, c: str) -> ConversationRows:
            x = convs.get((t, c))
            if x is None:
                x = convs[(t, c)] = ConversationRows()
            return x

        for (tenant, cid, u), (op, value) in sorted(self.states.items(), key=lambda kv: kv[0]):
            ts = ts_of(tenant, cid)
            if op == "put":
                conv(tenant, cid).rows.append((ps["conv_state"], (tenant, cid, u, *value, ts), ROW_BYTES))
                cell = session_cell(session_state([value[i] for i in _SESSION]))
                run = paired((ps["user_state"], (tenant, u, cid, *value, ts)), copy, (tenant, u, cid, cell, ts))
                above = floors.pop((tenant, u), None)
                if above is not None:
                    run = Encoded(run.body + floor_statement(floor_id, tenant, u, above), run.rows + 1, run.key)
                members.append(run)
            elif op == "gap":
                delivered, skipping, gap_end, cell = value
                cells = (seq_cell(delivered), skipping, seq_cell(gap_end))
                conv(tenant, cid).rows.append((ps["conv_gap"], (ts, *cells, tenant, cid, u), ROW_BYTES))
                gap = ps["session_state_gap"], (ts, cell, tenant, u, cid)
                members.append(paired((ps["user_gap"], (ts, *cells, tenant, u, cid)), *gap))
            else:
                conv(tenant, cid).rows.append((ps["conv_delete"], (ts, tenant, cid, u), ROW_BYTES))
                gone = ps["session_state_delete"], (ts, tenant, u, cid)
                members.append(paired((ps["user_delete"], (ts, tenant, u, cid)), *gone))
        for (tenant, cid, seq), (cells, broadcast, size) in self.messages.items():
            x, ts = conv(tenant, cid), ts_of(tenant, cid)
            x.rows.append((ps["message"], (tenant, *cells, ts), size))
            if broadcast:
                x.rows.append((ps["broadcast"], (tenant, cid, seq, ts), ROW_BYTES))
        for (t, c), (cells, size) in self.heads.items():
            conv(t, c).head = (ps["head"], (t, c, *cells, ts_of(t, c)), size)
        # a user put then deleted in this unit (a join, a leave) has its stay's entries: alone
        members.extend(floor_row(floor_id, t, u, above) for (t, u), above in floors.items())
        return members, convs

    def delivery_rows(
        self,
        ps: Mapping[str, PreparedStatement],
        ts_of: Callable[..., int],
        at: float,
        convs: dict[tuple[str, str], ConversationRows],
    ) -> None:
        """The delivery records into their conversations' rows, materialized `at`."""
        for (t, c, q), r in self.deliveries.items():
            convs.setdefault((t, c), ConversationRows()).rows.append(
                (ps["delivery"], (t, c, q, *delivery_cells(r), at, ts_of(t, c)), ROW_BYTES)
            )

    def session_head_rows(self, statement_id: bytes, ts_of: Callable[..., int]) -> list[Encoded]:
        """The session heads' copy of each head put (ADR-0042; session_heads.py)."""
        return session_head_rows(self.heads.items(), statement_id, ts_of)

    def head_lookups(self) -> list[tuple[str, str, str, str]]:
        """(tenant, conversation_id, aggregate id, size bucket) of the heads put with their lookups (ADR-0049)."""
        return [(t, c, aggregate_id, bucket) for (t, c), (aggregate_id, bucket) in self.lookups.items()]


_DELIVERED = STATE_COLUMNS.index("delivered_conversation_seq")
_SKIPPING = STATE_COLUMNS.index("skipping")
_GAP_END = STATE_COLUMNS.index("gap_end")
_SESSION = tuple(STATE_COLUMNS.index(c) for c in SESSION_STATE_COLUMNS)  # a state row's cells a login reads


def json_body(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON body as a store of JSON text gives it back (tuples become lists, keys strings)."""
    return dict(json.loads(json.dumps(body)))
