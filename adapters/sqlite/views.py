"""SQLite backend of the read side: views (heads, messages, states, delivery
records, admin views, tracking) in one WAL database; the mailbox store it is given
(RocksDB, or adapters/sqlite/mailbox.py) keeps its own file so it can be rebuilt and
swapped on its own.

Mailbox writes are idempotent (INSERT OR IGNORE on the primary key) and are made
durable before the views transaction that records the tracking position commits,
so a crash between the two replays into no duplicate (invariant X).

The schema and its migration are schema.py's, the unit of work's writer writer.py's, the
pool of read connections the login borrows connect.py's (as in adapters/cassandra/)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from adapters.sqlite.connect import READ_POOL_SIZE, VIEWS_FILE, ReadPool, connect
from adapters.sqlite.errors import sqlite_boundary
from adapters.sqlite.schema import migrate_views
from adapters.sqlite.writer import SqliteWriter
from projections.ports import ALL_TARGETS as ALL_TARGETS  # the targets a unit of work writes
from projections.ports import LogPosition, MailboxEntry, MailboxStore, MailboxTimer, timed_write
from projections.rows import STATE_COLUMNS, delivery_dict, head_dict, message_dict
from projections.state import SessionHead, SessionItem, SessionState, UserConversationState

T = TypeVar("T")


def _no_step(_name: str) -> None:
    pass


@sqlite_boundary
class SqliteViews:
    """The views database plus the mailbox store; one writer, many readers. SQLite's errors
    are raised as the port errors (errors.py)."""

    atomic_units = True  # one SQLite transaction (the mailbox's idempotent entries ahead of it)

    def __init__(self, data_dir: Path | str, mailbox: MailboxStore, *, prefix: str = "", readonly: bool = False,
                 timer: MailboxTimer | None = None) -> None:  # fmt: skip
        """`mailbox` is the mailbox store these views own (which engine: fanout/bootstrap/embedded.py).
        `readonly`: open existing views without writing anything (no migration), to read
        beside a running serve. `timer` is told how long each mailbox write of a unit took."""
        self.dir = Path(data_dir)
        self.readonly = readonly
        if not readonly:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"{prefix}{VIEWS_FILE}"
        self._con = connect(self.path, readonly=readonly)
        if not readonly:
            migrate_views(self._con)
        self.mailbox: MailboxStore = mailbox
        self.timer = timer
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._pool = ReadPool(self.path, READ_POOL_SIZE)

    # -- writing -------------------------------------------------------------

    @contextmanager
    def unit_of_work(
        self,
        targets: frozenset[str] = ALL_TARGETS,
        *,
        now: float | None = None,
        checkpoint: Callable[[str], None] | None = None,
    ) -> Iterator[SqliteWriter]:
        """Everything written in the block commits with the tracking positions.
        The mailbox shards are made durable first (idempotent), then the views. Named steps
        (`checkpoint`'s, where the crash tests kill): `mailbox` before each message's
        mailbox write, `tracking` once the mailbox holds the unit and the views have not
        committed it."""
        with self._write_lock:
            con = self._con
            w = SqliteWriter(con, targets)
            con.execute("BEGIN IMMEDIATE")
            try:
                yield w
                step, timer = checkpoint or _no_step, self.timer
                for tenant, refs in w.mailbox:
                    step("mailbox")
                    timed_write(self.mailbox, tenant, refs, timer)
                if w.mailbox:
                    self.mailbox.flush()
                step("tracking")
                w.finish(now if now is not None else time.time())
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:  # a full disk or an I/O error may have rolled it back already
                    con.execute("ROLLBACK")
                raise

    def compare_and_put_capacity(self, name: str, expected: dict[str, Any] | None, body: dict[str, Any]) -> bool:
        with self._write_lock:
            con = self._con
            con.execute("BEGIN IMMEDIATE")
            try:
                row = con.execute("SELECT body FROM capacity WHERE projection=?", (name,)).fetchone()
                stored = json.loads(row[0]) if row else None
                if stored != (None if expected is None else json.loads(json.dumps(expected))):
                    con.execute("ROLLBACK")
                    return False
                con.execute("INSERT OR REPLACE INTO capacity VALUES (?,?)", (name, json.dumps(body)))
                con.execute("COMMIT")
                return True
            except BaseException:
                if con.in_transaction:  # SQLite may have rolled it back (a full disk)
                    con.execute("ROLLBACK")
                raise

    def record_pushes(self, tenant: str, conversation_id: str, seq: int, pushes: int) -> None:
        with self._write_lock:
            self._con.execute(
                "UPDATE delivery SET online_pushes=coalesce(online_pushes, 0)+? "
                "WHERE tenant=? AND conversation_id=? AND conversation_seq=?",
                (pushes, tenant, conversation_id, seq),
            )

    # -- reading -------------------------------------------------------------

    def reader(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = connect(self.path, readonly=self.readonly)
        return con

    def position(self, projection: str, partition: int = 0) -> int:
        row = (
            self.reader()
            .execute("SELECT position FROM tracking WHERE projection=? AND partition=?", (projection, partition))
            .fetchone()
        )
        return int(row[0]) if row else 0

    def positions(self) -> dict[tuple[str, int], int]:
        """(projection, partition) -> the last position applied."""
        return {
            (r[0], r[1]): r[2] for r in self.reader().execute("SELECT projection, partition, position FROM tracking")
        }

    def log_position(self, partition: int) -> LogPosition | None:
        row = (
            self.reader()
            .execute("SELECT position, next_offset FROM log_positions WHERE partition=?", (partition,))
            .fetchone()
        )
        return LogPosition(int(row[0]), int(row[1])) if row else None

    def mailbox_written(self) -> int | None:
        """The last message whose mailbox entries these views' commits wrote (None: none
        recorded): the mailbox's written() is at least this unless it lost writes (ADR-0056)."""
        row = self.reader().execute("SELECT position FROM mailbox_written WHERE partition=0").fetchone()
        return None if row is None else int(row[0])

    def log_position_later(self, partition: int) -> Callable[[], LogPosition | None]:
        return partial(self.log_position, partition)  # one file: read when asked

    def views_position(self, projection: str) -> int:
        """One log, one partition."""
        return self.position(projection, 0)

    def conversation_key(self, aggregate_id: UUID) -> tuple[str, str]:
        row = (
            self.reader()
            .execute("SELECT tenant, conversation_id FROM heads WHERE aggregate_id=?", (str(aggregate_id),))
            .fetchone()
        )
        if row is None:
            raise LookupError(f"unknown conversation aggregate {aggregate_id}")
        return row[0], row[1]

    def load_conversation(
        self, tenant: str, conversation_id: str
    ) -> tuple[dict[str, Any] | None, dict[str, UserConversationState], list[int]]:
        con = self.reader()
        head = self.head(tenant, conversation_id)
        states = {
            r["user_id"]: UserConversationState.from_row(r)
            for r in con.execute(
                "SELECT * FROM states INDEXED BY states_by_conversation WHERE tenant=? AND conversation_id=?",
                (tenant, conversation_id),
            )
        }
        broadcasts = [
            r[0]
            for r in con.execute(
                "SELECT conversation_seq FROM messages WHERE tenant=? AND conversation_id=? "
                "AND (mention_all=1 OR announcement=1) ORDER BY conversation_seq",
                (tenant, conversation_id),
            )
        ]
        return head, states, broadcasts

    def head(self, tenant: str, conversation_id: str) -> dict[str, Any] | None:
        row = (
            self.reader()
            .execute("SELECT * FROM heads WHERE tenant=? AND conversation_id=?", (tenant, conversation_id))
            .fetchone()
        )
        return head_dict(row) if row else None

    def first_sessions(self, tenant: str, user_id: str, batch: int) -> tuple[list[SessionItem], bool] | None:
        return None  # one statement: sessions() is the quick way

    def heads_by_scope(self, tenant: str, size_bucket: str) -> list[str]:
        return [
            r[0]
            for r in self.reader().execute(
                "SELECT conversation_id FROM heads WHERE tenant=? AND size_bucket=?", (tenant, size_bucket)
            )
        ]

    def tenants(self) -> list[str]:
        return [r[0] for r in self.reader().execute("SELECT DISTINCT tenant FROM heads ORDER BY tenant")]

    def conversation_activity(
        self, tenant: str | None, size_bucket: str | None = None
    ) -> Iterator[tuple[str, str, str, list[float]]]:
        """One pass over heads joined to their members' states, not a query per conversation."""
        where = {"h.tenant = ?": tenant, "h.size_bucket = ?": size_bucket}
        kept = {k: v for k, v in where.items() if v is not None}
        rows = self.reader().execute(
            "SELECT h.tenant, h.conversation_id, h.size_bucket, s.last_active FROM heads h "
            "LEFT JOIN states s ON s.tenant = h.tenant AND s.conversation_id = h.conversation_id "
            + ("WHERE " + " AND ".join(kept) + " " if kept else "")
            + "ORDER BY h.tenant, h.conversation_id",
            tuple(kept.values()),
        )
        for (t, cid, bucket), group in groupby(rows, key=lambda r: (r[0], r[1], r[2])):
            yield t, cid, bucket, [r[3] for r in group if r[3] is not None]

    def state(self, tenant: str, user_id: str, conversation_id: str) -> dict[str, Any] | None:
        row = (
            self.reader()
            .execute(
                "SELECT * FROM states WHERE tenant=? AND user_id=? AND conversation_id=?",
                (tenant, user_id, conversation_id),
            )
            .fetchone()
        )
        return dict(row) if row else None

    def user_states(self, tenant: str, user_id: str) -> dict[str, UserConversationState]:
        """The user's rows: one range of the primary key (tenant, user_id, conversation_id),
        built positionally (a login reads thousands)."""
        cur = self.reader().execute(
            f"SELECT conversation_id, {', '.join(STATE_COLUMNS)} FROM states WHERE tenant=? AND user_id=?",
            (tenant, user_id),
        )
        cur.row_factory = None
        return {
            r[0]: UserConversationState(
                r[1], r[2], r[3], r[4], bool(r[5]), r[6], r[7], [int(x) for x in r[8].split(",")] if r[8] else [], r[9]
            )
            for r in cur
        }

    def sessions(self, tenant: str, user_id: str, batch: int) -> Iterator[list[SessionItem]]:
        """The login read in one statement: the user's state rows (a range of the primary
        key) joined to their heads, sorted by SQLite, fetched a batch at a time from one
        cursor (one read snapshot); the personal mentions are counted in SQL. The port
        asks for no join: this is SQLite's fastest way to answer it (measured, PERFORMANCE.md)."""
        mentions = "CASE WHEN s.mention_seqs = '' THEN 0 ELSE length(s.mention_seqs) - length(replace(s.mention_seqs, ',', '')) + 1 END"
        sql = (
            f"SELECT {', '.join('h.' + c for c in SessionHead._fields)}, s.read_conversation_seq, "
            f"s.delivered_conversation_seq, s.skipping, s.gap_end, s.rebuilt_seq, {mentions}, s.broadcast_base "
            "FROM states AS s JOIN heads AS h ON h.tenant = s.tenant AND h.conversation_id = s.conversation_id "
            "WHERE s.tenant = ? AND s.user_id = ? ORDER BY h.last_activity_at DESC, s.conversation_id"
        )
        width = len(SessionHead._fields)

        def pairs(rows: list[tuple[Any, ...]]) -> list[SessionItem]:
            return [(SessionHead._make(r[:width]), SessionState._make(r[width:])) for r in rows]

        yield from self._login_batches(sql, (tenant, user_id), batch, pairs)

    def heads(self, tenant: str, conversation_ids: Sequence[str], batch: int) -> Iterator[list[SessionHead]]:
        """The login's heads: one statement over the ids (a JSON array bound once), sorted
        by SQLite, fetched a batch at a time from one cursor (one read snapshot)."""
        # CROSS JOIN keeps the id list outside: one primary-key search per id (an IN list
        # would first build an index of the ids); the ids are a parameter, not a table.
        sql = (
            f"SELECT {', '.join('h.' + c for c in SessionHead._fields)} "
            "FROM json_each(?2) AS ids CROSS JOIN heads AS h ON h.tenant = ?1 AND h.conversation_id = ids.value "
            "ORDER BY h.last_activity_at DESC, h.conversation_id"
        )
        args = (tenant, json.dumps(list(conversation_ids)))
        yield from self._login_batches(sql, args, batch, lambda rows: list(map(SessionHead._make, rows)))

    def _login_batches(
        self, sql: str, args: tuple[Any, ...], batch: int, make: Callable[[list[tuple[Any, ...]]], list[T]]
    ) -> Iterator[list[T]]:
        """A login read's rows, `batch` at a time (each made into items by `make`), from one
        cursor (one read snapshot) on a connection borrowed from the pool."""
        con = self._pool.try_acquire()
        if con is None:
            # Every pooled cursor is lent to a login in progress: read this list in one
            # statement on the thread's own connection (one snapshot, no extra descriptor).
            cur = self.reader().execute(sql, args)
            cur.row_factory = None
            rows = cur.fetchall()
            for i in range(0, len(rows), batch):
                yield make(rows[i : i + batch])
            return
        cur = con.cursor()
        cur.row_factory = None
        try:  # one cursor, one read snapshot across the batches
            cur.execute(sql, args)
            while rows := cur.fetchmany(batch):
                yield make(rows)
        finally:
            cur.close()  # ends the read snapshot before the connection goes back
            self._pool.release(con)

    def messages(self, tenant: str, conversation_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        rows = (
            self.reader()
            .execute(
                "SELECT * FROM messages WHERE tenant=? AND conversation_id=? AND conversation_seq>? "
                "ORDER BY conversation_seq LIMIT ?",
                (tenant, conversation_id, after_seq, limit),
            )
            .fetchall()
        )
        return [message_dict(r) for r in rows]

    def message(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None:
        row = (
            self.reader()
            .execute(
                "SELECT * FROM messages WHERE tenant=? AND conversation_id=? AND conversation_seq=?",
                (tenant, conversation_id, seq),
            )
            .fetchone()
        )
        return message_dict(row) if row else None

    def delivery(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None:
        row = (
            self.reader()
            .execute(
                "SELECT * FROM delivery WHERE tenant=? AND conversation_id=? AND conversation_seq=?",
                (tenant, conversation_id, seq),
            )
            .fetchone()
        )
        return delivery_dict(row) if row else None

    def review(self, review_id: str) -> dict[str, Any]:
        row = self.reader().execute("SELECT body FROM reviews WHERE review_id=?", (review_id,)).fetchone()
        if row is None:
            raise LookupError(review_id)
        return dict(json.loads(row[0]))

    def reviews(self, tenant: str) -> list[dict[str, Any]]:
        return [
            json.loads(r[0])
            for r in self.reader().execute("SELECT body FROM reviews WHERE tenant=? ORDER BY rowid", (tenant,))
        ]

    def tier(self, tier_id: str) -> dict[str, Any] | None:
        row = self.reader().execute("SELECT body FROM tiers WHERE tier_id=?", (tier_id,)).fetchone()
        return dict(json.loads(row[0])) if row else None

    def capacity_state(self, name: str) -> dict[str, Any] | None:
        row = self.reader().execute("SELECT body FROM capacity WHERE projection=?", (name,)).fetchone()
        return json.loads(row[0]) if row else None

    def capacity_states(self, names: Sequence[str]) -> list[dict[str, Any] | None]:
        return [self.capacity_state(n) for n in names]

    def mailbox_page(self, tenant: str, user_id: str, after: int, limit: int) -> list[MailboxEntry]:
        # Only entries whose views transaction committed are visible: a cursor never skips.
        until = self.views_position("delivery")
        return self.mailbox.read(tenant, user_id, after, until, limit)

    def reopen_mailbox(self) -> None:
        """After a storage failure: the projector retries on a freshly opened mailbox store."""
        with self._write_lock:
            self.mailbox.reopen()

    def close(self) -> None:
        self._con.close()
        self._pool.close()
        self.mailbox.close()
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
