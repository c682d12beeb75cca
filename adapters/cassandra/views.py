"""Cassandra backend of the read side (the views of the distributed runtime): a
ViewStore whose unit of work buffers its writes and executes them, at the end of the
block, in three rounds, every request of a round in flight at once, in an order that
makes a crash part-way harmless (ADR-0012, ADR-0025): A. the member-keyed rows (mailbox
entries, user-keyed states with the login's copy of them, ADR-0043), the heads' lookups, reviews / tiers / capacity; B. per
conversation ONE batch of its messages, delivery records, conversation-keyed states AND
its head (with the position of the last event applied to it): one partition key, so one
mutation, applied atomically; then the session heads' copy of those heads (ADR-0042); C. the
tracking positions. Cassandra has no transaction
across partitions: a crash can leave round A (and some conversations of round B) written
without the tracking, and the projections are idempotent for that
(tests/contract/test_projection_replay.py).

Every read is one partition (or a bounded set of partitions read concurrently); no
join. Layout, keys, consistency and numbers: docs/adr/0014-cassandra-data-model.md.
The mailbox store is given to the constructor (the composition root picks it); the
session and the tables come from connect.py and schema.py.

Why this module is long: the ViewStore on Cassandra: its prepared statements, the commit's
rounds (the rows come from writer.py) and every read of the ReadSide port, which share one
session and one set of statements."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement

from adapters.cassandra.batches import Row, grouped
from adapters.cassandra.connect import TUPLE_ROWS, Connection, open_session, run
from adapters.cassandra.mailbox import CassandraMailbox, Statements
from adapters.cassandra.mailbox_floors import COPY as FLOORS
from adapters.cassandra.mailbox_floors import SELECT as SELECT_FLOOR
from adapters.cassandra.mailbox_floors import UPDATE as UPDATE_FLOOR
from adapters.cassandra.schema import TABLES
from adapters.cassandra.session_heads import session_head_shard
from adapters.cassandra.session_states import COPY as STATES_COPY
from adapters.cassandra.session_states import session_of_cell, vouched
from adapters.cassandra.stamps import stamp
from adapters.cassandra.writer import (
    MEMBER_BATCH_ROWS,
    SESSION_STATE_COLUMNS,
    CassandraWriter,
    conversation_batches,
    json_body,
    session_state,
    state_row,
)
from projections.head_cache import HeadCache
from projections.ports import ALL_TARGETS, LogPosition, MailboxEntry, MailboxStore
from projections.rows import (
    DELIVERY_RECORD,
    HEAD_COLUMNS,
    MESSAGE_COLUMNS,
    STATE_COLUMNS,
    delivery_dict,
    head_dict,
    message_dict,
)
from projections.state import SessionHead, SessionItem, SessionState, UserConversationState

IN_FLIGHT = 200  # requests in the air at once
PUSH_COUNTS_KEPT = 10_000  # messages whose push count a replica remembers (a message is pushed at once)
ACTIVITY_READS = 256  # conversations' states partitions an activity read has read at once (memory bounded)
HEADS_PER_READ = 100  # conversation heads read by one request of the login's batched read
# A login's heads read from the session heads' copy (ADR-0042) when at least this many, and this
# many of one partition to a request (docs/PERFORMANCE.md section 22)
COPY_READ_FROM = 500
COPY_PER_READ = 100
# rows of the user's states partition per page of the login's read (one page for most users)
SESSION_STATES_PAGE = 10_000
COPY_RECHECK = 30.0  # seconds between asking whether the states' copy is vouched, until it is


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
        # An API replica's cache of the heads its logins read (ADR-0035), fed by the workers'
        # commit records; None elsewhere (workers, tools): every head is read.
        self.head_cache: HeadCache | None = None
        self.copy_read_from = COPY_READ_FROM  # a login's heads from the session heads' copy from this many
        self.read_states_copy = True  # False: a login reads user_states even where the copy is vouched (benches)
        # copy -> vouched complete (ADR-0043's states copy, ADR-0045's mailbox floors), and when asked
        self._vouched: dict[str, bool] = {}
        self._vouched_asked: dict[str, float] = {}
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
            "floor": p(UPDATE_FLOOR.format(ks=ks)),  # written with a user's state row (ADR-0045)
            "log_position": p(
                f"INSERT INTO {ks}.log_positions (partition, position, next_offset) VALUES (?, ?, ?) {ts}"
            ),
            "head": p(
                f"INSERT INTO {ks}.heads (tenant, conversation_id, {', '.join(HEAD_COLUMNS)}) "
                f"VALUES (?, ?, {', '.join('?' * len(HEAD_COLUMNS))}) {ts}"
            ),
            "session_head": p(
                f"INSERT INTO {ks}.session_heads (tenant, shard, {', '.join(SessionHead._fields)}) "
                f"VALUES (?, ?, {', '.join('?' * len(SessionHead._fields))}) {ts}"
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
            # the login's copy of user_states (ADR-0043), written with it (writer.py rows)
            "session_state": p(
                f"INSERT INTO {ks}.session_states (tenant, user_id, conversation_id, state) VALUES (?, ?, ?, ?) {ts}"
            ),
            "session_state_gap": p(
                f"UPDATE {ks}.session_states {ts} SET state=? WHERE tenant=? AND user_id=? AND conversation_id=?"
            ),
            "session_state_delete": p(
                f"DELETE FROM {ks}.session_states {ts} WHERE tenant=? AND user_id=? AND conversation_id=?"
            ),
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
        self._mailbox_statements: Statements | None = (
            Statements.prepare(session, ks) if self._cassandra_mailbox is not None else None
        )
        self._r: dict[str, PreparedStatement] = {
            "position": p(f"SELECT position FROM {ks}.tracking WHERE projection=? AND partition=?"),
            "projection": p(f"SELECT partition, position FROM {ks}.tracking WHERE projection=?"),
            "head": p(f"SELECT * FROM {ks}.heads WHERE tenant=? AND conversation_id=?"),
            "heads_in": p(
                f"SELECT {', '.join(SessionHead._fields)} FROM {ks}.heads WHERE tenant=? AND conversation_id IN ?"
            ),
            "session_heads_in": p(
                f"SELECT {', '.join(SessionHead._fields)} FROM {ks}.session_heads "
                "WHERE tenant=? AND shard=? AND conversation_id IN ?"
            ),
            "by_aggregate": p(f"SELECT tenant, conversation_id FROM {ks}.heads_by_aggregate WHERE aggregate_id=?"),
            "by_tenant": p(f"SELECT conversation_id, size_bucket FROM {ks}.heads_by_tenant WHERE tenant=?"),
            "conv_states": p(f"SELECT * FROM {ks}.conversation_states WHERE tenant=? AND conversation_id=?"),
            "last_active": p(f"SELECT last_active FROM {ks}.conversation_states WHERE tenant=? AND conversation_id=?"),
            "floor": p(SELECT_FLOOR.format(ks=ks)),
            "broadcasts": p(f"SELECT conversation_seq FROM {ks}.broadcasts WHERE tenant=? AND conversation_id=?"),
            "state": p(f"SELECT * FROM {ks}.user_states WHERE tenant=? AND user_id=? AND conversation_id=?"),
            "user_states": p(f"SELECT * FROM {ks}.user_states WHERE tenant=? AND user_id=?"),
            "session_states": p(
                f"SELECT conversation_id, {', '.join(SESSION_STATE_COLUMNS)} FROM {ks}.user_states "
                "WHERE tenant=? AND user_id=?"
            ),
            "session_states_in": p(
                f"SELECT conversation_id, {', '.join(SESSION_STATE_COLUMNS)} FROM {ks}.user_states "
                "WHERE tenant=? AND user_id=? AND conversation_id IN ?"
            ),
            "states_copy": p(f"SELECT conversation_id, state FROM {ks}.session_states WHERE tenant=? AND user_id=?"),
            "states_copy_in": p(
                f"SELECT conversation_id, state FROM {ks}.session_states "
                "WHERE tenant=? AND user_id=? AND conversation_id IN ?"
            ),
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
        session between the views and the mailbox instead (fanout/bootstrap/replica.py)."""
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
           member rows of a conversation too large for one batch go first, in chunks; then
           the session heads' copy of the heads (ADR-0042), so the copy is never newer than
           a head and its rows (a crash before it: the replay writes it);
        C. tracking, last: each position stamped with itself, so it never goes back."""
        ps = self._w
        stamps: dict[tuple[str, ...], int] = {}

        def ts_of(*key: str) -> int:  # the stamp of a row's partition (CassandraWriter.stamp_of)
            ts = stamps.get(key)
            if ts is None:
                ts = stamps[key] = w.stamp_of(*key)
            return ts

        w.step("mailbox")
        members, conversations = w.rows(self._w, ts_of)
        rows_a: list[Row] = []
        if self._cassandra_mailbox is not None and w.mailbox:
            # this keyspace's table: its rows ride round A, grouped by partition across the unit
            rows_a.extend(self._cassandra_mailbox.rows(w.mailbox, self._mailbox_statements))
            rows_a.extend(self._cassandra_mailbox.hour_rows(w.mailbox, self._mailbox_statements))
        else:
            for tenant, refs in w.mailbox:  # another store: written (and flushed) before round A
                self.mailbox.write(tenant, refs)
            if w.mailbox:
                self.mailbox.flush()
        rows_a.extend(members)
        unindex: list[Row] = []  # the login index: member-keyed, round A; the rows moved from, after it
        for (t, u, c), (bucket, drops) in w.activity.items():
            ts = ts_of(t, c)
            unindex.extend((ps["unindex"], (ts, t, u, b, c)) for b in sorted(drops))
            if bucket is not None:
                rows_a.append((ps["index"], (t, u, bucket, c, ts)))
        for t, c, aggregate_id, size_bucket in w.head_lookups():
            ts = ts_of(t, c)
            rows_a.append((ps["by_aggregate"], (aggregate_id, t, c, ts)))
            rows_a.append((ps["by_tenant"], (t, c, size_bucket, ts)))
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
        if observe is not None and self._mailbox_statements is not None and w.mailbox:
            observe(time.perf_counter() - started, w.mailbox_entries, w.largest_message)
        if unindex:  # after the rows moved to: a login read never misses a conversation in between
            run(self.session, grouped(unindex, MEMBER_BATCH_ROWS, self.keyspace), self.in_flight)
        # delivery records, materialized_at once every entry is written (as SQLite and memory stamp it)
        w.delivery_rows(self._w, ts_of, now if now is not None else time.time(), conversations)
        # B. a conversation's rows that do not fit in one batch with its head, then the heads
        early, final = conversation_batches(conversations.values(), self.keyspace)
        w.step("rows")
        run(self.session, early, self.in_flight)
        w.step("heads")
        run(self.session, final, self.in_flight)
        # the session heads' copy (ADR-0042): after the heads, so it is never newer than they are
        w.step("session_heads")
        copies = w.session_head_rows(ps["session_head"].query_id, ts_of)
        run(self.session, grouped(copies, MEMBER_BATCH_ROWS, self.keyspace), self.in_flight)
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
            row = self.session.execute(self._w["capacity_create"], (name, json.dumps(json_body(body)))).one()
        else:
            row = self.session.execute(
                self._w["capacity_swap"], (json.dumps(json_body(body)), name, json.dumps(json_body(expected)))
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
        return self.log_position_later(partition)()

    def log_position_later(self, partition: int) -> Callable[[], LogPosition | None]:
        """The read is in flight from now; the result waits for it."""
        future = self.session.execute_async(self._r["log_position"], (partition,))

        def result() -> LogPosition | None:
            row = future.result().one()
            return LogPosition(int(row["position"]), int(row["next_offset"])) if row is not None else None

        return result

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
        """The heads of a login, most recent activity first, `batch` to a list: those the
        replica's cache holds (ADR-0035), the rest read (`_read_heads`) and cached."""
        ids = list(dict.fromkeys(conversation_ids))
        cache = self.head_cache
        rows: list[SessionHead] = []
        if cache is not None:
            cached, ticket = cache.get_many(tenant, ids)
            if cached:
                rows.extend(cached.values())
                ids = [c for c in ids if c not in cached]
        read = self._read_heads(tenant, ids)
        if cache is not None and read:
            cache.fill(ticket, tenant, read)
        rows.extend(read)
        rows.sort(key=lambda h: (-(h.last_activity_at or 0.0), h.conversation_id))
        for i in range(0, len(rows), batch):
            yield rows[i : i + batch]

    def _read_heads(self, tenant: str, ids: list[str]) -> list[SessionHead]:
        """Many heads from the session heads' copy (ADR-0042): at most SESSION_HEAD_SHARDS
        partitions, `IN` on their clustering key, the requests concurrent (Cassandra's CPU a
        head ~4x less than a partition each). The ones it lacks (a unit of work between its
        heads and its copy, a keyspace written before the copy) are read from `heads`,
        HEADS_PER_READ partitions a request (`IN` on the partition key's last column), as are
        all of them when fewer than `copy_read_from` (COPY_READ_FROM): one request then costs less than one
        per shard."""
        read: list[SessionHead] = []
        if len(ids) >= self.copy_read_from:
            by_shard: dict[int, list[str]] = {}
            for c in ids:
                by_shard.setdefault(session_head_shard(c), []).append(c)
            read = self._read_concurrently(
                self._r["session_heads_in"],
                [
                    (tenant, shard, part[i : i + COPY_PER_READ])
                    for shard, part in by_shard.items()
                    for i in range(0, len(part), COPY_PER_READ)
                ],
            )
            found = {h.conversation_id for h in read}
            ids = [c for c in ids if c not in found] if len(found) < len(ids) else []
        if ids:
            read.extend(
                self._read_concurrently(
                    self._r["heads_in"],
                    [(tenant, ids[i : i + HEADS_PER_READ]) for i in range(0, len(ids), HEADS_PER_READ)],
                )
            )
        return read

    def _read_concurrently(self, statement: PreparedStatement, args: list[tuple[Any, ...]]) -> list[SessionHead]:
        read: list[SessionHead] = []
        results = execute_concurrent_with_args(
            self.session, statement, args, concurrency=IN_FLIGHT, execution_profile=TUPLE_ROWS
        )
        for ok, result in results:
            if not ok:
                raise result
            read.extend(map(SessionHead._make, result))
        return read

    def sessions(self, tenant: str, user_id: str, batch: int) -> Iterator[list[SessionItem]]:
        """The two reads (projections/state.py sessions_by_two_reads), each row read as a
        tuple of only what a session item shows: the user's states partition, then the heads."""
        states = self.session_states(tenant, user_id)
        for heads in self.heads(tenant, list(states), batch):
            yield [(h, states[h.conversation_id]) for h in heads]

    def session_states(self, tenant: str, user_id: str) -> dict[str, SessionState]:
        """conversation id -> what the session list needs of the user's state in it (one
        partition, SESSION_STATES_PAGE rows a page): from the login's copy, a cell a row,
        where it is vouched complete (ADR-0043), else from user_states' columns."""
        copy = self.states_copy_vouched()
        statement = self._r["states_copy" if copy else "session_states"].bind((tenant, user_id))
        statement.fetch_size = SESSION_STATES_PAGE
        rows = self.session.execute(statement, execution_profile=TUPLE_ROWS)
        if copy:
            return {c: session_of_cell(cell) for c, cell in rows}
        return {r[0]: session_state(r[1:]) for r in rows}

    def states_copy_vouched(self) -> bool:
        """Whether the login reads the states' copy (ADR-0043, session_states.py `vouched`):
        once it is, for good; until then asked again at most every COPY_RECHECK seconds."""
        return self.read_states_copy and self._copy_vouched(STATES_COPY)

    def _copy_vouched(self, copy: str) -> bool:
        """Whether `copy` is vouched complete (session_states.py `vouched`): once it is, for
        good; until then asked again at most every COPY_RECHECK seconds."""
        if not self._vouched.get(copy, False):
            now = time.monotonic()
            asked = self._vouched_asked.get(copy)
            if asked is None or now - asked >= COPY_RECHECK:
                self._vouched_asked[copy] = now
                self._vouched[copy] = vouched(self.session, self.keyspace, copy)
        return self._vouched.get(copy, False)

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
        copy = self.states_copy_vouched()
        states_f = [
            self.session.execute_async(
                self._r["states_copy_in" if copy else "session_states_in"],
                (tenant, user_id, ids[i : i + HEADS_PER_READ]),
                execution_profile=TUPLE_ROWS,
            )
            for i in range(0, len(ids), HEADS_PER_READ)
        ]
        heads = [h for part in self.heads(tenant, ids, len(ids)) for h in part]  # while the states come
        states: dict[str, SessionState] = {}
        for f in states_f:
            for r in f.result():
                states[r[0]] = session_of_cell(r[1]) if copy else session_state(r[1:])
        found = [(h, states[h.conversation_id]) for h in heads if h.conversation_id in states]
        if not complete and len(found) < batch:
            return None
        return found, complete

    def heads_by_scope(self, tenant: str, size_bucket: str) -> list[str]:
        rows = self.session.execute(self._r["by_tenant"], (tenant,))
        return [r["conversation_id"] for r in rows if r["size_bucket"] == size_bucket]

    def tenants(self) -> list[str]:
        rows = self.session.execute(f"SELECT DISTINCT tenant FROM {self.keyspace}.heads_by_tenant", timeout=300)
        return sorted(r["tenant"] for r in rows)

    def conversation_activity(
        self, tenant: str | None, size_bucket: str | None = None
    ) -> Iterator[tuple[str, str, str, list[float]]]:
        """A tenant's conversations from its heads_by_tenant partition (the bucket's only,
        when given, before any state is read), then their states partitions, ACTIVITY_READS
        at a time, the requests of each group in flight at once."""
        for t in [tenant] if tenant is not None else self.tenants():
            rows = [
                (r["conversation_id"], r["size_bucket"])
                for r in self.session.execute(self._r["by_tenant"], (t,))
                if size_bucket is None or r["size_bucket"] == size_bucket
            ]
            for i in range(0, len(rows), ACTIVITY_READS):
                group = rows[i : i + ACTIVITY_READS]
                results = execute_concurrent_with_args(
                    self.session,
                    self._r["last_active"],
                    [(t, cid) for cid, _ in group],
                    concurrency=IN_FLIGHT,
                    execution_profile=TUPLE_ROWS,
                )
                for (cid, bucket), (ok, result) in zip(group, results, strict=True):
                    if not ok:
                        raise result
                    yield t, cid, bucket, [r[0] for r in result]

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
        states = {r["user_id"]: UserConversationState.from_row(state_row(r)) for r in states_f.result()}
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
            **state_row(row),
        }

    def user_states(self, tenant: str, user_id: str) -> Mapping[str, UserConversationState]:
        """One partition (tenant, user)."""
        return {
            r["conversation_id"]: UserConversationState.from_row(state_row(r))
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
        any order, and a cursor must never pass an entry another partition has yet to write.
        Read from the user's mailbox floor on where the floors are vouched (ADR-0045): every
        entry is above it, and a user without one has none up to that position (the floor is
        written with the state row of the join, by a unit tracked before the entries')."""
        until = self.views_position("delivery")
        if self._copy_vouched(FLOORS):
            row = self.session.execute(self._r["floor"], (tenant, user_id), execution_profile=TUPLE_ROWS).one()
            if row is None:
                return []
            after = max(after, row[0])
        return self.mailbox.read(tenant, user_id, after, until, limit)

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
        return self.capacity_states([name])[0]

    def capacity_states(self, names: Sequence[str]) -> list[dict[str, Any] | None]:
        """Every read in flight at once (a worker's evaluation reads one a partition)."""
        futures = [self.session.execute_async(self._r["capacity"], (n,)) for n in names]
        rows = [f.result().one() for f in futures]
        return [dict(json.loads(r["body"])) if r is not None else None for r in rows]
