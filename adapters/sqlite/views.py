"""SQLite backend of the read side: views (heads, messages, states, delivery
records, admin views, tracking) in one WAL database; the mailbox store it is given
(RocksDB, or adapters/sqlite/mailbox.py) keeps its own file so it can be rebuilt and
swapped on its own.

Mailbox writes are idempotent (INSERT OR IGNORE on the primary key) and are made
durable before the views transaction that records the tracking position commits,
so a crash between the two replays into no duplicate (invariant X).

Why this module is long: the ViewStore on SQLite: schema, writer and every read of the port
share one connection per thread and one transaction per unit of work."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import Any
from uuid import UUID

from adapters.sqlite.connect import connect
from projections.ports import ALL_TARGETS as ALL_TARGETS  # the targets a unit of work writes
from projections.ports import LogPosition, MailboxEntry, MailboxStore, MessageRefs
from projections.rows import (
    DELIVERY_RECORD,
    HEAD_COLUMNS,
    MESSAGE_COLUMNS,
    STATE_COLUMNS,
    DeliveryRecord,
    MessageRow,
    delivery_cells,
    delivery_dict,
    head_cells,
    head_dict,
    message_cells,
    message_dict,
)
from projections.state import SessionHead, SessionItem, SessionState, UserConversationState

VIEWS_SCHEMA = """
CREATE TABLE IF NOT EXISTS tracking (
    projection TEXT NOT NULL, partition INTEGER NOT NULL, position INTEGER NOT NULL,
    PRIMARY KEY (projection, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS heads (
    tenant TEXT NOT NULL, conversation_id TEXT NOT NULL, aggregate_id TEXT NOT NULL,
    title TEXT, latest_conversation_seq INTEGER NOT NULL, last_activity_id TEXT,
    last_activity_at REAL, preview TEXT, member_count INTEGER NOT NULL, size_bucket TEXT NOT NULL,
    write_policy TEXT NOT NULL, broadcasts INTEGER NOT NULL, created_at REAL, position INTEGER NOT NULL,
    PRIMARY KEY (tenant, conversation_id)) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS heads_by_aggregate ON heads (aggregate_id);
CREATE TABLE IF NOT EXISTS messages (
    tenant TEXT NOT NULL, conversation_id TEXT NOT NULL, conversation_seq INTEGER NOT NULL,
    message_id TEXT NOT NULL, sender TEXT NOT NULL, text TEXT NOT NULL, mentions TEXT NOT NULL,
    mention_all INTEGER NOT NULL, reply_to_seq INTEGER, announcement INTEGER NOT NULL,
    sent_at REAL NOT NULL, pos INTEGER NOT NULL,
    PRIMARY KEY (tenant, conversation_id, conversation_seq));
CREATE TABLE IF NOT EXISTS states (
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    read_conversation_seq INTEGER NOT NULL, joined_seq INTEGER NOT NULL, last_active REAL NOT NULL,
    delivered_conversation_seq INTEGER, skipping INTEGER NOT NULL, gap_end INTEGER, rebuilt_seq INTEGER NOT NULL,
    mention_seqs TEXT NOT NULL, broadcast_base INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id, conversation_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS states_by_conversation ON states (tenant, conversation_id);
CREATE TABLE IF NOT EXISTS delivery (
    tenant TEXT NOT NULL, conversation_id TEXT NOT NULL, conversation_seq INTEGER NOT NULL,
    message_id TEXT NOT NULL, write_policy TEXT NOT NULL, member_count INTEGER NOT NULL,
    mailbox_entries INTEGER NOT NULL, shards INTEGER NOT NULL, body_bytes INTEGER NOT NULL,
    pos INTEGER NOT NULL, online_pushes INTEGER, materialized_at REAL,
    PRIMARY KEY (tenant, conversation_id, conversation_seq));
CREATE TABLE IF NOT EXISTS reviews (review_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tiers (tier_id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS capacity (projection TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS log_positions (
    partition INTEGER PRIMARY KEY, position INTEGER NOT NULL, next_offset INTEGER NOT NULL);
"""

# PRAGMA user_version of the views. 2: the states columns take the ADR's names
# (read_conversation_seq, delivered_conversation_seq). 3: tracking per (projection,
# partition); heads record the position of the last event applied to the conversation.
# Older files are brought up in place.
VIEWS_SCHEMA_VERSION = 3
_RENAMED_STATE_COLUMNS = {"read_seq": "read_conversation_seq", "delivered_seq": "delivered_conversation_seq"}


def migrate_views(con: sqlite3.Connection) -> None:
    """Create the views schema, or bring an older file up to VIEWS_SCHEMA_VERSION
    (each step idempotent, so a crash part-way is finished by the next open)."""
    version = con.execute("PRAGMA user_version").fetchone()[0]
    if version > VIEWS_SCHEMA_VERSION:
        raise RuntimeError(
            f"the views were written by a newer fanout (schema {version} > {VIEWS_SCHEMA_VERSION}): "
            "upgrade fanout, or delete them and run `fanout rebuild all`"
        )
    columns = {row[1] for row in con.execute("PRAGMA table_info(states)")}
    for old, new in _RENAMED_STATE_COLUMNS.items():
        if old in columns:
            con.execute(f"ALTER TABLE states RENAME COLUMN {old} TO {new}")
    heads = {row[1] for row in con.execute("PRAGMA table_info(heads)")}
    if heads and "position" not in heads:
        con.execute("ALTER TABLE heads ADD COLUMN position INTEGER NOT NULL DEFAULT 0")
    tracking = {row[1] for row in con.execute("PRAGMA table_info(tracking)")}
    if tracking and "partition" not in tracking:
        with con:
            con.execute("ALTER TABLE tracking RENAME TO tracking_v2")
            con.execute(
                "CREATE TABLE tracking (projection TEXT NOT NULL, partition INTEGER NOT NULL, "
                "position INTEGER NOT NULL, PRIMARY KEY (projection, partition)) WITHOUT ROWID"
            )
            con.execute("INSERT INTO tracking SELECT projection, 0, position FROM tracking_v2")
            con.execute("DROP TABLE tracking_v2")
    con.executescript(VIEWS_SCHEMA)
    con.execute(f"PRAGMA user_version = {VIEWS_SCHEMA_VERSION}")


class ReadPool:
    """A fixed number of read-only connections for reads that hold a cursor across
    awaits (the login's session list): a login borrows one instead of opening its own,
    so concurrent logins cannot run the process out of file descriptors (3 per
    connection in WAL mode: the database, -wal and -shm)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._free: list[sqlite3.Connection] = []
        self._opened = 0
        self._lock = threading.Lock()
        self._closed = False

    def try_acquire(self) -> sqlite3.Connection | None:
        """A connection, or None when all `size` are lent out (never blocks)."""
        with self._lock:
            if self._free:
                return self._free.pop()
            if self._opened >= self.size or self._closed:
                return None
            self._opened += 1
        try:
            return connect(self.path, readonly=True)
        except BaseException:
            with self._lock:
                self._opened -= 1
            raise

    def release(self, con: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed:
                self._free.append(con)
                return
        con.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for con in free:
            con.close()


READ_POOL_SIZE = 8  # the API's executor threads


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
        self.above = 0  # unused here: a mailbox read is one index range (ADR-0045 is Cassandra's)
        self.checkpoint: Callable[[str], None] | None = None  # one transaction: never called
        self.head_keys: set[tuple[str, str]] = set()  # the heads put (heads_written)

    def track(self, projection: str, position: int, partition: int = 0) -> None:
        """Record the last position this unit of work applied for (projection, partition);
        written after everything else of the unit, in the same commit."""
        self.positions[(projection, partition)] = position

    def track_log(self, partition: int, position: int, next_offset: int) -> None:
        self.log_positions[partition] = LogPosition(position, next_offset)

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


class SqliteViews:
    """The views database plus the mailbox store; one writer, many readers."""

    atomic_units = True  # one SQLite transaction (the mailbox's idempotent entries ahead of it)

    def __init__(
        self, data_dir: Path | str, mailbox: MailboxStore, *, prefix: str = "", readonly: bool = False
    ) -> None:
        """`mailbox` is the mailbox store these views own (which engine: fanout/bootstrap/embedded.py).
        `readonly`: open existing views without writing anything (no migration), to read
        beside a running serve."""
        self.dir = Path(data_dir)
        self.readonly = readonly
        if not readonly:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"{prefix}views.sqlite"
        self._con = connect(self.path, readonly=readonly)
        if not readonly:
            migrate_views(self._con)
        self.mailbox: MailboxStore = mailbox
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._pool = ReadPool(self.path, READ_POOL_SIZE)

    # -- writing -------------------------------------------------------------

    @contextmanager
    def unit_of_work(
        self, targets: frozenset[str] = ALL_TARGETS, *, now: float | None = None
    ) -> Iterator[SqliteWriter]:
        """Everything written in the block commits with the tracking positions.
        The mailbox shards are made durable first (idempotent), then the views."""
        with self._write_lock:
            con = self._con
            w = SqliteWriter(con, targets)
            con.execute("BEGIN IMMEDIATE")
            try:
                yield w
                for tenant, refs in w.mailbox:
                    self.mailbox.write(tenant, refs)
                if w.mailbox:
                    self.mailbox.flush()
                if w.deliveries:
                    at = now if now is not None else time.time()
                    con.executemany(
                        "UPDATE delivery SET materialized_at=? WHERE tenant=? AND conversation_id=? AND conversation_seq=?",
                        [(at, *d) for d in w.deliveries],
                    )
                con.executemany(
                    "INSERT INTO tracking VALUES (?, ?, ?) "
                    "ON CONFLICT(projection, partition) DO UPDATE SET position=excluded.position",
                    [(name, partition, pos) for (name, partition), pos in w.positions.items()],
                )
                con.executemany(
                    "INSERT OR REPLACE INTO log_positions VALUES (?, ?, ?)",
                    [(partition, *lp) for partition, lp in w.log_positions.items()],
                )
                con.execute("COMMIT")
            except BaseException:
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

        con = self._pool.try_acquire()
        if con is None:
            # Every pooled cursor is lent to a login in progress: read this list in one
            # statement on the thread's own connection (one snapshot, no extra descriptor).
            cur = self.reader().execute(sql, (tenant, user_id))
            cur.row_factory = None
            rows = cur.fetchall()
            for i in range(0, len(rows), batch):
                yield pairs(rows[i : i + batch])
            return
        cur = con.cursor()
        cur.row_factory = None
        try:  # one cursor, one read snapshot across the batches
            cur.execute(sql, (tenant, user_id))
            while rows := cur.fetchmany(batch):
                yield pairs(rows)
        finally:
            cur.close()  # ends the read snapshot before the connection goes back
            self._pool.release(con)

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
        con = self._pool.try_acquire()
        if con is None:
            # Every pooled cursor is lent to a login in progress: read this list in one
            # statement on the thread's own connection (one snapshot, no extra descriptor).
            cur = self.reader().execute(sql, args)
            cur.row_factory = None
            rows = list(map(SessionHead._make, cur.fetchall()))
            for i in range(0, len(rows), batch):
                yield rows[i : i + batch]
            return
        cur = con.cursor()
        cur.row_factory = None
        try:  # one cursor, one read snapshot across the batches
            cur.execute(sql, args)
            while rows := cur.fetchmany(batch):
                yield list(map(SessionHead._make, rows))
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
