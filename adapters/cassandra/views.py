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
session and the tables come from connect.py and schema.py, the prepared statements from
statements.py, the rows of each round from writer.py, the login's reads from login.py.

Why this module is long: the ViewStore on Cassandra: the commit's rounds and every read of
the ReadSide port but the login's, which share one session, one set of statements and the
replica's push counts."""

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

from adapters.cassandra.batches import Row, grouped
from adapters.cassandra.connect import TUPLE_ROWS, Connection, open_session, run
from adapters.cassandra.errors import cassandra_boundary, storage_error
from adapters.cassandra.login import LoginReads
from adapters.cassandra.mailbox import CassandraMailbox, Statements
from adapters.cassandra.mailbox_floors import COPY as FLOORS
from adapters.cassandra.schema import TABLES
from adapters.cassandra.stamps import stamp
from adapters.cassandra.statements import ViewStatements
from adapters.cassandra.writer import MEMBER_BATCH_ROWS, CassandraWriter, conversation_batches, json_body, state_row
from projections.head_cache import HeadCache
from projections.ports import ALL_TARGETS, LogPosition, MailboxEntry, MailboxStore, MailboxTimer, timed_write
from projections.rows import delivery_dict, head_dict, message_dict
from projections.state import UserConversationState

IN_FLIGHT = 200  # requests in the air at once
PUSH_COUNTS_KEPT = 10_000  # messages whose push count a replica remembers (a message is pushed at once)
ACTIVITY_READS = 256  # conversations' states partitions an activity read has read at once (memory bounded)


@cassandra_boundary  # the driver's errors raised as the port errors (errors.py)
class CassandraViews(LoginReads):
    """A ViewStore on Cassandra (plus the mailbox store it is given); the login's reads are
    login.py's."""

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
        timer: MailboxTimer | None = None,
        head_cache: HeadCache | None = None,
    ) -> None:
        """`session`: a connected session whose keyspace has the tables (connect.open_session
        makes both); `partitions`: the log's partition count (the views' position is the
        minimum over them); `connection`: the session's Connection when this store owns it
        (close() closes it, after the mailbox; connect.py); `in_flight`:
        requests in the air at once while a unit of work commits (ADR-0027: at RF 3 each
        is three replicas' work, and too many time out in the replicas' queues); `timer`:
        told how long each unit's mailbox writes took (the round they ride, ADR-0026);
        `head_cache`: an API replica's heads kept for its logins (login.py, ADR-0035)."""
        self._w, reads = ViewStatements.prepare(session, keyspace)
        super().__init__(session, keyspace, reads, head_cache)
        self.in_flight = in_flight
        self.mailbox: MailboxStore = mailbox
        self.partitions = partitions
        self._connection = connection
        self._lock = threading.Lock()  # one unit of work at a time
        self._pushes_lock = threading.Lock()
        self._pushed: dict[tuple[str, str, int], int] = {}  # this replica's push counts, the latest kept
        self.pusher = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._written = 0  # the last review write stamp (reviews are listed in write order)
        self.timer = timer
        # the mailbox table of this keyspace: its entries ride the first round of a commit (a
        # store of another engine or keyspace is written on its own, one batch per shard list
        # ahead of the round: 3-4x the CPU per message)
        self._cassandra_mailbox: CassandraMailbox | None = (
            mailbox if isinstance(mailbox, CassandraMailbox) and mailbox.keyspace == keyspace else None
        )
        self._mailbox_statements: Statements | None = (
            Statements.prepare(session, keyspace) if self._cassandra_mailbox is not None else None
        )

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
        self,
        targets: frozenset[str] = ALL_TARGETS,
        *,
        now: float | None = None,
        checkpoint: Callable[[str], None] | None = None,
    ) -> Iterator[CassandraWriter]:
        """Writes in the block are executed when it exits without an exception (an
        exception writes nothing), in the crash-safe order of the module docstring;
        `checkpoint` is called between its rounds."""
        with self._lock:
            w = CassandraWriter(targets, checkpoint)
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
                timed_write(self.mailbox, tenant, refs, self.timer)
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
        # "mailbox.part": about 3/4 of the mailbox's batches of round A sent (at least 200 rows a
        # batch), some landed, some not: where the crash tests kill or stop a worker mid-fan-out
        part = (w.mailbox_entries * 3 // (4 * MEMBER_BATCH_ROWS), lambda: w.step("mailbox.part"))
        run(self.session, grouped(rows_a, MEMBER_BATCH_ROWS, self.keyspace), self.in_flight, at=part)
        if self.timer is not None and self._mailbox_statements is not None and w.mailbox:
            self.timer.observe(time.perf_counter() - started, w.mailbox_entries, w.largest_message)
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
            try:
                row = future.result().one()
            except Exception as exc:  # answered after the method returned: translated here
                error = storage_error(exc)
                if error is None:
                    raise
                raise error from exc
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
