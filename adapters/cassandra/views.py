"""Cassandra backend of the read side (the views of the distributed runtime): a
ViewStore whose unit of work buffers its writes and executes them, at the end of the
block, in three rounds, every request of a round in flight at once, in an order that
makes a crash part-way harmless (ADR-0012, ADR-0025): A. the member-keyed rows (mailbox
entries, user-keyed states), the heads' lookups, reviews / tiers / capacity; B. per
conversation ONE batch of its messages, delivery records, conversation-keyed states AND
its head (with the position of the last event applied to it): one partition key, so one
mutation, applied atomically; C. the tracking positions. Cassandra has no transaction
across partitions: a crash can leave round A (and some conversations of round B) written
without the tracking, and the projections are idempotent for that
(tests/contract/test_projection_replay.py).

Every read is one partition (or a bounded set of partitions read concurrently); no
join. Layout, keys, consistency and numbers: docs/adr/0014-cassandra-data-model.md.
The mailbox store is given to the constructor (the composition root picks it); the
session and the tables come from connect.py and schema.py."""

from __future__ import annotations

import copy
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from adapters.cassandra.connect import Connection, open_session, run
from adapters.cassandra.mailbox import INSERT_ENTRY, CassandraMailbox, Row, grouped
from adapters.cassandra.schema import TABLES
from adapters.cassandra.stamps import stamp
from projections.ports import ALL_TARGETS, LogPosition, MailboxEntry, MailboxStore, MessageRefs
from projections.rows import (
    DELIVERY_RECORD,
    HEAD_COLUMNS,
    MESSAGE_COLUMNS,
    STATE_COLUMNS,
    delivery_cells,
    delivery_dict,
    head_cells,
    head_dict,
    message_cells,
    message_dict,
)
from projections.state import SessionHead, SessionItem, SessionState, UserConversationState, sessions_by_two_reads

BATCH_ROWS = 100  # rows per UNLOGGED batch
MEMBER_BATCH_ROWS = 250  # rows per batch of round A (member-keyed rows: one partition each)
# Round B: a batch holds whole conversations (rows and head: one mutation each), at most this many
# rows and about this many bytes (Cassandra warns above batch_size_warn_threshold, 64 KiB here)
CONVERSATION_BATCH_ROWS = 250
CONVERSATION_BATCH_BYTES = 48 * 1024
ROW_BYTES = 160  # an estimate of a row's size without its text
IN_FLIGHT = 200  # requests in the air at once
PUSH_COUNTS_KEPT = 10_000  # messages whose push count a replica remembers (a message is pushed at once)
HEADS_PER_READ = 100  # conversation heads read by one request of the login's batched read

# A null written by an INSERT is a tombstone: two per member row (no gap is the common case) made
# a 100k-member partition 200k tombstones, read on every load of the conversation, and that was
# what ran Cassandra out of heap in the crash tests. "No value" is stored as -1 (seqs are >= 0).
NO_SEQ = -1
_NULLABLE_SEQS = ("delivered_conversation_seq", "gap_end")


def _seq_cell(value: int | None) -> int:
    return NO_SEQ if value is None else value


def _state_cells(state: UserConversationState) -> tuple[Any, ...]:
    row = state.row()
    for c in _NULLABLE_SEQS:
        row[c] = _seq_cell(row[c])
    return tuple(row.values())


def _state_row(r: Any) -> dict[str, Any]:
    """A stored state row with its sentinels read back as None."""
    row = {c: r[c] for c in STATE_COLUMNS}
    for c in _NULLABLE_SEQS:
        if row[c] == NO_SEQ:
            row[c] = None
    return row


SizedRow = tuple[PreparedStatement, tuple[Any, ...], int]  # a statement, its values, its estimated bytes


@dataclass
class _Conversation:
    """One conversation's rows of a unit of work (round B of the commit)."""

    rows: list[SizedRow] = field(default_factory=list)  # member states, messages, broadcasts, delivery records
    head: SizedRow | None = None


def _conversation_batches(
    conversations: Iterable[_Conversation],
) -> tuple[list[tuple[BatchStatement, None]], list[tuple[BatchStatement, None]]]:
    """Round B's batches. Each conversation's rows and its head go in ONE batch: one partition
    key, so one mutation, applied atomically. Several conversations share a batch up to
    CONVERSATION_BATCH_ROWS rows and CONVERSATION_BATCH_BYTES. A conversation too large for one
    batch (a large join, a burst of long messages) sends its first rows ahead in chunks (`early`,
    written before any head); its last chunk rides with its head in `final`."""
    early: list[tuple[BatchStatement, None]] = []
    final: list[tuple[BatchStatement, None]] = []
    batch, n, size = BatchStatement(batch_type=BatchType.UNLOGGED), 0, 0
    for x in conversations:
        rows = [*x.rows, *([x.head] if x.head is not None else [])]
        tail, tail_bytes = len(rows), 0  # the rows that fit in one batch with the head, from the end
        while tail > 0 and len(rows) - tail < CONVERSATION_BATCH_ROWS:
            if tail_bytes + rows[tail - 1][2] > CONVERSATION_BATCH_BYTES and tail < len(rows):
                break
            tail -= 1
            tail_bytes += rows[tail][2]
        ahead, rows = rows[:tail], rows[tail:]
        chunk, chunk_n, chunk_bytes = BatchStatement(batch_type=BatchType.UNLOGGED), 0, 0
        for stmt, args, b in ahead:
            if chunk_n and (chunk_n == CONVERSATION_BATCH_ROWS or chunk_bytes + b > CONVERSATION_BATCH_BYTES):
                early.append((chunk, None))
                chunk, chunk_n, chunk_bytes = BatchStatement(batch_type=BatchType.UNLOGGED), 0, 0
            chunk.add(stmt, args)
            chunk_n, chunk_bytes = chunk_n + 1, chunk_bytes + b
        if chunk_n:
            early.append((chunk, None))
        if n and (n + len(rows) > CONVERSATION_BATCH_ROWS or size + tail_bytes > CONVERSATION_BATCH_BYTES):
            final.append((batch, None))
            batch, n, size = BatchStatement(batch_type=BatchType.UNLOGGED), 0, 0
        for stmt, args, _ in rows:
            batch.add(stmt, args)
        n, size = n + len(rows), size + tail_bytes
    if n:
        final.append((batch, None))
    return early, final


# -- the unit of work ---------------------------------------------------------------


class CassandraWriter:
    """The ViewWriter of one unit of work: every write is buffered (the last one per key
    wins, as it would in order), executed by the store when the block exits cleanly."""

    def __init__(self, targets: frozenset[str], partition: int) -> None:
        self.targets = targets
        self.partition = partition
        self.mailbox: list[tuple[str, MessageRefs]] = []
        self.mailbox_entries = 0
        self.positions: dict[tuple[str, int], int] = {}
        self.log_positions: dict[int, tuple[int, int]] = {}  # partition -> (position, next offset)
        # Called with the next step's name between the steps of the commit (the host's fencing
        # check and fault-injection points); an exception there ends the commit.
        self.checkpoint: Callable[[str], None] | None = None
        self.heads: dict[tuple[str, str], dict[str, Any]] = {}
        self.messages: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.deliveries: dict[tuple[str, str, int], dict[str, Any]] = {}
        # (tenant, conversation_id, user_id) -> ("put", state) | ("gap", (delivered, skipping, gap_end)) | ("delete", None)
        self.states: dict[tuple[str, str, str], tuple[str, Any]] = {}
        # the login index: (tenant, user_id, conversation_id) -> (the bucket its row goes to, or
        # None; the buckets whose rows are deleted)
        self.activity: dict[tuple[str, str, str], tuple[int | None, frozenset[int]]] = {}
        self.reviews: dict[str, dict[str, Any]] = {}
        self.tiers: dict[str, dict[str, Any]] = {}
        self.capacity: dict[str, dict[str, Any]] = {}
        # A unit may span log partitions (the worker's take): each row is stamped with the
        # position ITS partition reaches in the unit, never another partition's (ADR-0021: a
        # row's stamps must grow with its own partition's log). The partition a row came
        # from is `partition` when it was put (the host sets it before each partition's events).
        self.partition_of: dict[tuple[str, ...], int] = {}

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
        self.capacity[name] = _json(body)
        self._from("capacity", name)

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, Any]) -> None:
        if "heads" in self.targets:
            self.heads[(tenant, conversation_id)] = copy.deepcopy(head)
            self._from(tenant, conversation_id)

    def put_message(self, tenant: str, conversation_id: str, message: dict[str, Any]) -> None:
        if "heads" in self.targets:
            self.messages[(tenant, conversation_id, message["conversation_seq"])] = copy.deepcopy(message)
            self._from(tenant, conversation_id)

    def put_mailbox(self, tenant: str, refs: MessageRefs) -> None:
        if "mailbox" not in self.targets or not refs.shards:
            return
        self.mailbox.append((tenant, refs))
        self.mailbox_entries += sum(len(b) for b in refs.shards.values())

    def put_states(
        self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]
    ) -> None:
        if "state" in self.targets:
            self._from(tenant, conversation_id)
            for u, s in states:
                self.states[(tenant, conversation_id, u)] = ("put", copy.deepcopy(s))

    def put_gaps(self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]) -> None:
        if "state" not in self.targets:
            return
        self._from(tenant, conversation_id)
        for u, s in states:
            key = (tenant, conversation_id, u)
            queued = self.states.get(key)
            if queued is not None and queued[0] == "put":  # a row written in this unit: update it here
                row = queued[1]
                row.delivered_conversation_seq, row.skipping, row.gap_end = (
                    s.delivered_conversation_seq,
                    s.skipping,
                    s.gap_end,
                )
            elif queued is None or queued[0] == "gap":
                self.states[key] = ("gap", (s.delivered_conversation_seq, int(s.skipping), s.gap_end))
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

    def put_delivery(self, tenant: str, conversation_id: str, seq: int, record: dict[str, Any]) -> None:
        if "heads" in self.targets:
            self.deliveries[(tenant, conversation_id, seq)] = dict(record)
            self._from(tenant, conversation_id)

    def put_review(self, review: dict[str, Any]) -> None:
        if "heads" in self.targets:
            r = _json(review)
            self.reviews.pop(r["review_id"], None)  # the one written last goes last
            self.reviews[r["review_id"]] = r
            self._from("review", r["review_id"])

    def put_tier(self, tier: dict[str, Any]) -> None:
        if "heads" in self.targets:
            t = _json(tier)
            self.tiers.setdefault(t["tier_id"], {}).update(t)
            self._from("tier", t["tier_id"])


class CassandraViews:
    """A ViewStore on Cassandra (plus the mailbox store it is given)."""

    atomic_units = False  # a commit in rounds (ADR-0025): a crash between them leaves some written

    def __init__(
        self,
        session: Session,
        keyspace: str,
        mailbox: MailboxStore,
        *,
        partitions: int = 1,
        connection: Connection | None = None,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        """`session`: a connected session whose keyspace has the tables (connect.open_session
        makes both); `partitions`: the log's partition count (the views' position is the
        minimum over them); `connection`: the session's Connection when this store owns it
        (close() closes it, after the mailbox; connect.py); `in_flight`:
        requests in the air at once while a unit of work commits (ADR-0027: at RF 3 each
        is three replicas' work, and too many time out in the replicas' queues)."""
        self.session = session
        self.in_flight = in_flight
        self.keyspace = keyspace
        self.mailbox: MailboxStore = mailbox
        self.partitions = partitions
        self._connection = connection
        self._lock = threading.Lock()  # one unit of work at a time
        self._pushes_lock = threading.Lock()
        self._pushed: dict[tuple[str, str, int], int] = {}  # this replica's push counts, the latest kept
        self.pusher = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._written = 0  # the last review write stamp (reviews are listed in write order)
        ks = keyspace
        p = session.prepare
        state_cols = ", ".join(STATE_COLUMNS)
        state_marks = ", ".join("?" * len(STATE_COLUMNS))
        ts = "USING TIMESTAMP ?"  # every write of a unit: its log position's stamp (stamps.py)
        self._w: dict[str, PreparedStatement] = {
            "track": p(f"INSERT INTO {ks}.tracking (projection, partition, position) VALUES (?, ?, ?) {ts}"),
            "log_position": p(
                f"INSERT INTO {ks}.log_positions (partition, position, next_offset) VALUES (?, ?, ?) {ts}"
            ),
            "head": p(
                f"INSERT INTO {ks}.heads (tenant, conversation_id, {', '.join(HEAD_COLUMNS)}) "
                f"VALUES (?, ?, {', '.join('?' * len(HEAD_COLUMNS))}) {ts}"
            ),
            "by_aggregate": p(
                f"INSERT INTO {ks}.heads_by_aggregate (aggregate_id, tenant, conversation_id) VALUES (?, ?, ?) {ts}"
            ),
            "by_tenant": p(
                f"INSERT INTO {ks}.heads_by_tenant (tenant, conversation_id, size_bucket) VALUES (?, ?, ?) {ts}"
            ),
            "message": p(
                f"INSERT INTO {ks}.messages (tenant, {', '.join(MESSAGE_COLUMNS)}) "
                f"VALUES (?, {', '.join('?' * len(MESSAGE_COLUMNS))}) {ts}"
            ),
            "broadcast": p(
                f"INSERT INTO {ks}.broadcasts (tenant, conversation_id, conversation_seq) VALUES (?, ?, ?) {ts}"
            ),
            "delivery": p(
                f"INSERT INTO {ks}.delivery (tenant, conversation_id, conversation_seq, {', '.join(DELIVERY_RECORD)}, "
                f"materialized_at) VALUES (?, ?, ?, {', '.join('?' * len(DELIVERY_RECORD))}, ?) {ts}"
            ),
            "conv_state": p(
                f"INSERT INTO {ks}.conversation_states (tenant, conversation_id, user_id, {state_cols}) "
                f"VALUES (?, ?, ?, {state_marks}) {ts}"
            ),
            "user_state": p(
                f"INSERT INTO {ks}.user_states (tenant, user_id, conversation_id, {state_cols}) "
                f"VALUES (?, ?, ?, {state_marks}) {ts}"
            ),
            "conv_gap": p(
                f"UPDATE {ks}.conversation_states {ts} SET delivered_conversation_seq=?, skipping=?, gap_end=? "
                "WHERE tenant=? AND conversation_id=? AND user_id=?"
            ),
            "user_gap": p(
                f"UPDATE {ks}.user_states {ts} SET delivered_conversation_seq=?, skipping=?, gap_end=? "
                "WHERE tenant=? AND user_id=? AND conversation_id=?"
            ),
            "conv_delete": p(
                f"DELETE FROM {ks}.conversation_states {ts} WHERE tenant=? AND conversation_id=? AND user_id=?"
            ),
            "user_delete": p(f"DELETE FROM {ks}.user_states {ts} WHERE tenant=? AND user_id=? AND conversation_id=?"),
            "index": p(
                f"INSERT INTO {ks}.login_index (tenant, user_id, bucket, conversation_id) VALUES (?, ?, ?, ?) {ts}"
            ),
            "unindex": p(
                f"DELETE FROM {ks}.login_index {ts} WHERE tenant=? AND user_id=? AND bucket=? AND conversation_id=?"
            ),
            "review": p(f"INSERT INTO {ks}.reviews (review_id, tenant, body, written) VALUES (?, ?, ?, ?) {ts}"),
            "review_by_tenant": p(
                f"INSERT INTO {ks}.reviews_by_tenant (tenant, review_id, body, written) VALUES (?, ?, ?, ?) {ts}"
            ),
            "tier": p(f"UPDATE {ks}.tiers {ts} SET body = body + ? WHERE tier_id = ?"),
            "capacity": p(f"INSERT INTO {ks}.capacity (projection, body) VALUES (?, ?) {ts}"),
            # not from the log (no fencing stamp): a replica's count, a monitor's compare-and-set
            "pushes": p(
                f"INSERT INTO {ks}.delivery_pushes (tenant, conversation_id, conversation_seq, pusher, pushes) "
                "VALUES (?, ?, ?, ?, ?)"
            ),
            "capacity_create": p(f"INSERT INTO {ks}.capacity (projection, body) VALUES (?, ?) IF NOT EXISTS"),
            "capacity_swap": p(f"UPDATE {ks}.capacity SET body=? WHERE projection=? IF body=?"),
        }
        # the mailbox table of this keyspace: its entries ride the first round of a commit. The
        # composition root may hand the store in wrapped (a meter of its writes, with `inner`):
        # the entries still ride round A, and the wrapper is told how long that round took
        # (`observe`). Before this looked through the wrapper, every entry took the slow path of
        # another store: one batch per shard list before the round (3-4x the CPU per message).
        inner = getattr(mailbox, "inner", mailbox)
        self._cassandra_mailbox: CassandraMailbox | None = (
            inner if isinstance(inner, CassandraMailbox) and inner.keyspace == keyspace else None
        )
        self._mailbox_insert: PreparedStatement | None = (
            p(INSERT_ENTRY.format(ks=ks)) if self._cassandra_mailbox is not None else None
        )
        self._r: dict[str, PreparedStatement] = {
            "position": p(f"SELECT position FROM {ks}.tracking WHERE projection=? AND partition=?"),
            "projection": p(f"SELECT partition, position FROM {ks}.tracking WHERE projection=?"),
            "head": p(f"SELECT * FROM {ks}.heads WHERE tenant=? AND conversation_id=?"),
            "session_head": p(
                f"SELECT {', '.join(SessionHead._fields)} FROM {ks}.heads WHERE tenant=? AND conversation_id=?"
            ),
            "session_heads": p(
                f"SELECT {', '.join(SessionHead._fields)} FROM {ks}.heads WHERE tenant=? AND conversation_id IN ?"
            ),
            "by_aggregate": p(f"SELECT tenant, conversation_id FROM {ks}.heads_by_aggregate WHERE aggregate_id=?"),
            "by_tenant": p(f"SELECT conversation_id, size_bucket FROM {ks}.heads_by_tenant WHERE tenant=?"),
            "conv_states": p(f"SELECT * FROM {ks}.conversation_states WHERE tenant=? AND conversation_id=?"),
            "last_active": p(f"SELECT last_active FROM {ks}.conversation_states WHERE tenant=? AND conversation_id=?"),
            "broadcasts": p(f"SELECT conversation_seq FROM {ks}.broadcasts WHERE tenant=? AND conversation_id=?"),
            "state": p(f"SELECT * FROM {ks}.user_states WHERE tenant=? AND user_id=? AND conversation_id=?"),
            "user_states": p(f"SELECT * FROM {ks}.user_states WHERE tenant=? AND user_id=?"),
            "states_in": p(f"SELECT * FROM {ks}.user_states WHERE tenant=? AND user_id=? AND conversation_id IN ?"),
            "login_index": p(f"SELECT bucket, conversation_id FROM {ks}.login_index WHERE tenant=? AND user_id=?"),
            "message": p(f"SELECT * FROM {ks}.messages WHERE tenant=? AND conversation_id=? AND conversation_seq=?"),
            "messages": p(
                f"SELECT * FROM {ks}.messages WHERE tenant=? AND conversation_id=? AND conversation_seq>? LIMIT ?"
            ),
            "delivery": p(f"SELECT * FROM {ks}.delivery WHERE tenant=? AND conversation_id=? AND conversation_seq=?"),
            "review": p(f"SELECT body FROM {ks}.reviews WHERE review_id=?"),
            "reviews": p(f"SELECT body, written FROM {ks}.reviews_by_tenant WHERE tenant=?"),
            "tier": p(f"SELECT body FROM {ks}.tiers WHERE tier_id=?"),
            "capacity": p(f"SELECT body FROM {ks}.capacity WHERE projection=?"),
            "pushes": p(
                f"SELECT pushes FROM {ks}.delivery_pushes WHERE tenant=? AND conversation_id=? AND conversation_seq=?"
            ),
            "log_position": p(f"SELECT position, next_offset FROM {ks}.log_positions WHERE partition=?"),
        }

    @classmethod
    def from_settings(cls, settings: Any, mailbox: MailboxStore, *, partitions: int = 1) -> CassandraViews:
        """Views on a session of their own (connect.open_session: the keyspace and the views'
        tables created if absent), which they own; `settings`: fanout.urls.CassandraSettings;
        `partitions`: the Kafka topic's partition count. The composition root shares one
        session between the views and the mailbox instead (fanout/bootstrap.py)."""
        connection = open_session(settings, tables=TABLES)
        try:
            return cls(
                connection.session,
                settings.keyspace,
                mailbox,
                partitions=partitions,
                connection=connection,
                in_flight=getattr(settings, "in_flight", IN_FLIGHT),
            )
        except BaseException:
            connection.close()
            raise

    # -- writing ---------------------------------------------------------------------

    @contextmanager
    def unit_of_work(
        self, targets: frozenset[str] = ALL_TARGETS, *, now: float | None = None, partition: int = 0
    ) -> Iterator[CassandraWriter]:
        """Writes in the block are executed when it exits without an exception (an
        exception writes nothing), in the crash-safe order of the module docstring."""
        with self._lock:
            w = CassandraWriter(targets, partition)
            yield w
            self._commit(w, now)

    def _commit(self, w: CassandraWriter, now: float | None) -> None:
        """Three rounds, every request of a round in flight at once (ADR-0025):
        A. member-keyed rows (mailbox entries, user-keyed states) and the rows a head needs to
           resolve (its lookups) and reviews / tiers / capacity;
        B. per conversation ONE batch of its messages, broadcasts, delivery records,
           conversation-keyed states and its head: one partition key of one keyspace, so one
           mutation, applied atomically (a head lands if and only if its rows do); only the
           member rows of a conversation too large for one batch go first, in chunks;
        C. tracking, last: each position stamped with itself, so it never goes back."""
        ps = self._w
        stamps: dict[tuple[str, ...], int] = {}

        def ts_of(*key: str) -> int:  # the stamp of a row's partition (CassandraWriter.stamp_of)
            ts = stamps.get(key)
            if ts is None:
                ts = stamps[key] = w.stamp_of(*key)
            return ts

        w.step("mailbox")
        members, conversations = self._rows(w, ts_of)
        rows_a: list[Row] = []
        for tenant, refs in w.mailbox:
            rows_a.extend(self._mailbox_rows(tenant, refs))
        rows_a.extend(members)
        unindex: list[Row] = []  # the login index: member-keyed, round A; the rows moved from, after it
        for (t, u, c), (bucket, drops) in w.activity.items():
            ts = ts_of(t, c)
            unindex.extend((ps["unindex"], (ts, t, u, b, c)) for b in sorted(drops))
            if bucket is not None:
                rows_a.append((ps["index"], (t, u, bucket, c, ts)))
        for (t, c), h in w.heads.items():
            ts = ts_of(t, c)
            rows_a.append((ps["by_aggregate"], (str(h["aggregate_id"]), t, c, ts)))
            rows_a.append((ps["by_tenant"], (t, c, h["size_bucket"], ts)))
        for r in w.reviews.values():
            text, written, ts = json.dumps(r), self._stamp(), ts_of("review", r["review_id"])
            rows_a.append((ps["review"], (r["review_id"], r["tenant"], text, written, ts)))
            rows_a.append((ps["review_by_tenant"], (r["tenant"], r["review_id"], text, written, ts)))
        for tier_id, tier in w.tiers.items():
            rows_a.append((ps["tier"], (ts_of("tier", tier_id), {k: json.dumps(v) for k, v in tier.items()}, tier_id)))
        for name, body in w.capacity.items():
            rows_a.append((ps["capacity"], (name, json.dumps(body), ts_of("capacity", name))))
        started = time.perf_counter()
        run(self.session, grouped(rows_a, MEMBER_BATCH_ROWS, self.keyspace), self.in_flight)
        observe = getattr(self.mailbox, "observe", None)
        if observe is not None and self._mailbox_insert is not None and w.mailbox:
            largest = max(sum(len(b) for b in refs.shards.values()) for _, refs in w.mailbox)
            observe(time.perf_counter() - started, w.mailbox_entries, largest)
        if unindex:  # after the rows moved to: a login read never misses a conversation in between
            run(self.session, grouped(unindex, MEMBER_BATCH_ROWS, self.keyspace), self.in_flight)
        # delivery records, materialized_at once every entry is written (as SQLite and memory stamp it)
        self._add_deliveries(w, ts_of, now if now is not None else time.time(), conversations)
        # B. a conversation's rows that do not fit in one batch with its head, then the heads
        early, final = _conversation_batches(conversations.values())
        w.step("rows")
        run(self.session, early, self.in_flight)
        w.step("heads")
        run(self.session, final, self.in_flight)
        w.step("tracking")
        run(
            self.session,
            [(ps["track"], (name, partition, pos, stamp(pos))) for (name, partition), pos in w.positions.items()]
            + [
                (ps["log_position"], (partition, pos, offset, stamp(pos)))
                for partition, (pos, offset) in w.log_positions.items()
            ],
            self.in_flight,
        )

    def _mailbox_rows(self, tenant: str, refs: MessageRefs) -> Iterable[Row]:
        if self._mailbox_insert is not None and self._cassandra_mailbox is not None:
            return self._cassandra_mailbox.rows(tenant, refs, self._mailbox_insert)  # this keyspace's table: round A
        self.mailbox.write(tenant, refs)  # another store: written (and flushed) before round A
        self.mailbox.flush()
        return ()

    def _rows(
        self, w: CassandraWriter, ts_of: Callable[..., int]
    ) -> tuple[list[tuple[PreparedStatement, tuple[Any, ...]]], dict[tuple[str, str], _Conversation]]:
        """The member-keyed state rows (round A), and each conversation's rows (round B)."""
        ps = self._w
        members: list[tuple[PreparedStatement, tuple[Any, ...]]] = []
        convs: dict[tuple[str, str], _Conversation] = {}

        def conv(t: str, c: str) -> _Conversation:
            x = convs.get((t, c))
            if x is None:
                x = convs[(t, c)] = _Conversation()
            return x

        for (tenant, cid, u), (op, value) in sorted(w.states.items(), key=lambda kv: kv[0]):
            ts = ts_of(tenant, cid)
            if op == "put":
                row = _state_cells(value)
                conv(tenant, cid).rows.append((ps["conv_state"], (tenant, cid, u, *row, ts), ROW_BYTES))
                members.append((ps["user_state"], (tenant, u, cid, *row, ts)))
            elif op == "gap":
                delivered, skipping, gap_end = value
                cells = (_seq_cell(delivered), skipping, _seq_cell(gap_end))
                conv(tenant, cid).rows.append((ps["conv_gap"], (ts, *cells, tenant, cid, u), ROW_BYTES))
                members.append((ps["user_gap"], (ts, *cells, tenant, u, cid)))
            else:
                conv(tenant, cid).rows.append((ps["conv_delete"], (ts, tenant, cid, u), ROW_BYTES))
                members.append((ps["user_delete"], (ts, tenant, u, cid)))
        for (tenant, cid, seq), m in w.messages.items():
            x, ts = conv(tenant, cid), ts_of(tenant, cid)
            x.rows.append(
                (
                    ps["message"],
                    (tenant, *message_cells(m), ts),
                    ROW_BYTES + len(m["text"].encode()),
                )
            )
            if m["mention_all"] or m["announcement"]:
                x.rows.append((ps["broadcast"], (tenant, cid, seq, ts), ROW_BYTES))
        for (t, c), h in w.heads.items():
            values = (t, c, *head_cells(h), ts_of(t, c))
            text = f"{h.get('title') or ''}{h.get('preview') or ''}"
            conv(t, c).head = (ps["head"], values, ROW_BYTES + len(text.encode()))
        return members, convs

    def _add_deliveries(
        self, w: CassandraWriter, ts_of: Callable[..., int], at: float, convs: dict[tuple[str, str], _Conversation]
    ) -> None:
        ps = self._w
        for (t, c, q), r in w.deliveries.items():
            convs.setdefault((t, c), _Conversation()).rows.append(
                (
                    ps["delivery"],
                    (t, c, q, *delivery_cells(r), at, ts_of(t, c)),
                    ROW_BYTES,
                )
            )

    def _stamp(self) -> int:
        """Increasing write stamps in microseconds: reviews list in the order written."""
        self._written = max(time.time_ns() // 1000, self._written + 1)
        return self._written

    def record_pushes(self, tenant: str, conversation_id: str, seq: int, pushes: int) -> None:
        """This replica's count for the message, in a row of its own: two replicas pushing
        one message never overwrite each other's count (read: their sum)."""
        with self._pushes_lock:
            key = (tenant, conversation_id, seq)
            total = self._pushed.pop(key, 0) + pushes
            self._pushed[key] = total
            while len(self._pushed) > PUSH_COUNTS_KEPT:
                self._pushed.pop(next(iter(self._pushed)))
            self.session.execute(self._w["pushes"], (tenant, conversation_id, seq, self.pusher, total))

    def compare_and_put_capacity(self, name: str, expected: dict[str, Any] | None, body: dict[str, Any]) -> bool:
        """A lightweight transaction: the body is written only if the stored one is still
        `expected` (None: absent). False when another writer changed it first."""
        if expected is None:
            row = self.session.execute(self._w["capacity_create"], (name, json.dumps(_json(body)))).one()
        else:
            row = self.session.execute(
                self._w["capacity_swap"], (json.dumps(_json(body)), name, json.dumps(_json(expected)))
            ).one()
        return bool(row["[applied]"])

    def reopen_mailbox(self) -> None:
        with self._lock:
            self.mailbox.reopen()

    def close(self) -> None:
        """Close the mailbox, then the Connection if this store owns it; closing again is harmless."""
        self.mailbox.close()
        if self._connection is not None:
            self._connection.close()

    # -- tracking ----------------------------------------------------------------------

    def position(self, projection: str, partition: int = 0) -> int:
        row = self.session.execute(self._r["position"], (projection, partition)).one()
        return int(row["position"]) if row else 0

    def positions(self) -> dict[tuple[str, int], int]:
        rows = self.session.execute(f"SELECT projection, partition, position FROM {self.keyspace}.tracking")
        return {(r["projection"], r["partition"]): r["position"] for r in rows}

    def log_position(self, partition: int) -> LogPosition | None:
        row = self.session.execute(self._r["log_position"], (partition,)).one()
        return LogPosition(int(row["position"]), int(row["next_offset"])) if row is not None else None

    def views_position(self, projection: str) -> int:
        """The position every partition 0..partitions-1 has applied (one partition read)."""
        tracked = {
            int(r["partition"]): int(r["position"]) for r in self.session.execute(self._r["projection"], (projection,))
        }
        return min(tracked.get(p, 0) for p in range(self.partitions))

    # -- conversations -----------------------------------------------------------------

    def conversation_key(self, aggregate_id: Any) -> tuple[str, str]:
        row = self.session.execute(self._r["by_aggregate"], (str(aggregate_id),)).one()
        if row is None:
            raise LookupError(f"unknown conversation aggregate {aggregate_id}")
        return row["tenant"], row["conversation_id"]

    def head(self, tenant: str, conversation_id: str) -> dict[str, Any] | None:
        row = self.session.execute(self._r["head"], (tenant, conversation_id)).one()
        return head_dict(row) if row is not None else None

    def heads(self, tenant: str, conversation_ids: Sequence[str], batch: int) -> Iterator[list[SessionHead]]:
        """One batched read: the heads' partitions, HEADS_PER_READ to a request (`IN` on the
        partition key's last column), the requests concurrent. One request per head cost
        about 0.4 ms of client time each: 1.9 s for a user in 5,000 conversations
        (bench/cassandra_sessions.py)."""
        ids = list(dict.fromkeys(conversation_ids))
        chunks = [(tenant, ids[i : i + HEADS_PER_READ]) for i in range(0, len(ids), HEADS_PER_READ)]
        results = execute_concurrent_with_args(self.session, self._r["session_heads"], chunks, concurrency=IN_FLIGHT)
        rows: list[SessionHead] = []
        for ok, result in results:
            if not ok:
                raise result
            for row in result:
                rows.append(SessionHead(*(row[f] for f in SessionHead._fields)))
        rows.sort(key=lambda h: (-(h.last_activity_at or 0.0), h.conversation_id))
        for i in range(0, len(rows), batch):
            yield rows[i : i + batch]

    def sessions(self, tenant: str, user_id: str, batch: int) -> Iterator[list[SessionItem]]:
        return sessions_by_two_reads(self, tenant, user_id, batch)

    def first_sessions(self, tenant: str, user_id: str, batch: int) -> tuple[list[SessionItem], bool] | None:
        """The first list from the login index (ADR-0028): (the sessions of every
        conversation whose last activity is in the index hours read, most recent first;
        whether that is all of the user's), or None when the index has no row for the user or
        holds fewer live rows than a list needs although it has more hours (then it cannot
        vouch for the order). Exact: every member has a row in the hour of the
        conversation's last activity, so the conversations not read were last active
        before the oldest hour read, after all of those that were."""
        statement = self._r["login_index"].bind((tenant, user_id))
        statement.fetch_size = max(2 * batch, 100)
        candidates: dict[str, None] = {}
        last: int | None = None
        complete = True
        for row in self.session.execute(statement):
            if len(candidates) >= batch and row["bucket"] != last:
                complete = False
                break
            candidates[row["conversation_id"]] = None
            last = row["bucket"]
        if not candidates:  # no conversation, or views written before the index: the two reads say
            return None
        ids = list(candidates)
        states_f = [
            self.session.execute_async(self._r["states_in"], (tenant, user_id, ids[i : i + HEADS_PER_READ]))
            for i in range(0, len(ids), HEADS_PER_READ)
        ]
        heads = [h for part in self.heads(tenant, ids, len(ids)) for h in part]  # while the states come
        states: dict[str, UserConversationState] = {}
        for f in states_f:
            for r in f.result():
                states[r["conversation_id"]] = UserConversationState.from_row(_state_row(r))
        found = [(h, SessionState.of(states[h.conversation_id])) for h in heads if h.conversation_id in states]
        if not complete and len(found) < batch:
            return None
        return found, complete

    def heads_by_scope(self, tenant: str, size_bucket: str) -> list[str]:
        rows = self.session.execute(self._r["by_tenant"], (tenant,))
        return [r["conversation_id"] for r in rows if r["size_bucket"] == size_bucket]

    def tenants(self) -> list[str]:
        rows = self.session.execute(f"SELECT DISTINCT tenant FROM {self.keyspace}.heads_by_tenant", timeout=300)
        return sorted(r["tenant"] for r in rows)

    def conversation_activity(self, tenant: str | None) -> Iterator[tuple[str, str, str, list[float]]]:
        for t in [tenant] if tenant is not None else self.tenants():
            for r in self.session.execute(self._r["by_tenant"], (t,)):
                actives = [
                    s["last_active"] for s in self.session.execute(self._r["last_active"], (t, r["conversation_id"]))
                ]
                yield t, r["conversation_id"], r["size_bucket"], actives

    def load_conversation(
        self, tenant: str, conversation_id: str
    ) -> tuple[dict[str, Any] | None, dict[str, UserConversationState], list[int]]:
        """The head, the conversation-keyed states partition, the broadcasts partition:
        three partitions read concurrently."""
        key = (tenant, conversation_id)
        head_f = self.session.execute_async(self._r["head"], key)
        states_f = self.session.execute_async(self._r["conv_states"], key)
        casts_f = self.session.execute_async(self._r["broadcasts"], key)
        head = head_f.result().one()
        states = {r["user_id"]: UserConversationState.from_row(_state_row(r)) for r in states_f.result()}
        broadcasts = [r["conversation_seq"] for r in casts_f.result()]
        return (head_dict(head) if head is not None else None), states, broadcasts

    # -- members -------------------------------------------------------------------------

    def state(self, tenant: str, user_id: str, conversation_id: str) -> dict[str, Any] | None:
        row = self.session.execute(self._r["state"], (tenant, user_id, conversation_id)).one()
        if row is None:
            return None
        return {
            "tenant": tenant,
            "user_id": user_id,
            "conversation_id": conversation_id,
            **_state_row(row),
        }

    def user_states(self, tenant: str, user_id: str) -> Mapping[str, UserConversationState]:
        """One partition (tenant, user)."""
        return {
            r["conversation_id"]: UserConversationState.from_row(_state_row(r))
            for r in self.session.execute(self._r["user_states"], (tenant, user_id))
        }

    # -- messages and delivery records ---------------------------------------------------

    def message(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None:
        row = self.session.execute(self._r["message"], (tenant, conversation_id, seq)).one()
        return message_dict(row) if row is not None else None

    def messages(self, tenant: str, conversation_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        if limit <= 0:
            return []
        return [
            message_dict(r)
            for r in self.session.execute(self._r["messages"], (tenant, conversation_id, after_seq, limit))
        ]

    def delivery(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None:
        """The record, with online_pushes summed over the replicas that pushed it (None
        before any counted)."""
        key = (tenant, conversation_id, seq)
        row_f = self.session.execute_async(self._r["delivery"], key)
        pushes_f = self.session.execute_async(self._r["pushes"], key)
        row = row_f.result().one()
        counts = [r["pushes"] for r in pushes_f.result()]
        if row is None:
            return None
        out = delivery_dict(row)
        if counts:
            out["online_pushes"] = sum(counts)
        return out

    def mailbox_page(self, tenant: str, user_id: str, after: int, limit: int) -> list[MailboxEntry]:
        """Entries up to the delivery projection's views' position: partitions commit in
        any order, and a cursor must never pass an entry another partition has yet to write."""
        return self.mailbox.read(tenant, user_id, after, self.views_position("delivery"), limit)

    # -- admin views -----------------------------------------------------------------------

    def review(self, review_id: str) -> dict[str, Any]:
        row = self.session.execute(self._r["review"], (review_id,)).one()
        if row is None:
            raise LookupError(review_id)
        return dict(json.loads(row["body"]))

    def reviews(self, tenant: str) -> list[dict[str, Any]]:
        rows = sorted(self.session.execute(self._r["reviews"], (tenant,)), key=lambda r: r["written"])
        return [json.loads(r["body"]) for r in rows]

    def tier(self, tier_id: str) -> dict[str, Any] | None:
        row = self.session.execute(self._r["tier"], (tier_id,)).one()
        if row is None or not row["body"]:
            return None
        return {k: json.loads(v) for k, v in row["body"].items()}

    def capacity_state(self, name: str) -> dict[str, Any] | None:
        row = self.session.execute(self._r["capacity"], (name,)).one()
        return dict(json.loads(row["body"])) if row is not None else None


def _json(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON body as a store of JSON text gives it back (tuples become lists, keys strings)."""
    return dict(json.loads(json.dumps(body)))
