"""SQLite backend of the mailbox (UserMailboxEntry): the slower alternative to RocksDB
(docs/adr/0004-mailbox-store.md), kept behind the same contract suite for small
deployments and comparison."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from adapters.sqlite.connect import connect
from adapters.sqlite.errors import sqlite_boundary
from projections.ports import MailboxEntry, MessageRefs


@sqlite_boundary
class SqliteMailbox:
    """UserMailboxEntry in SQLite: key (tenant, user_id, pos), a user-ordered B-tree.
    The slower alternative (docs/adr/0004-mailbox-store.md), kept behind the same
    contract suite for small deployments and comparison."""

    SCHEMA = """
    CREATE TABLE IF NOT EXISTS mailbox (
        tenant TEXT NOT NULL, user_id TEXT NOT NULL, pos INTEGER NOT NULL,
        conversation_seq INTEGER NOT NULL, conversation_id TEXT NOT NULL, flags INTEGER NOT NULL,
        PRIMARY KEY (tenant, user_id, pos)) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS written (id INTEGER PRIMARY KEY CHECK (id = 0), pos INTEGER NOT NULL);
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._write = connect(self.path)
        self._write.executescript(self.SCHEMA)
        self._local = threading.local()

    def _reader(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = connect(self.path)
        return con

    def write(self, tenant: str, refs: MessageRefs) -> int:
        con = self._write
        n = 0
        pos, seq, cid, special = refs.pos, refs.seq, refs.conversation_id, refs.special
        con.execute("BEGIN")
        try:
            for shard in sorted(refs.shards):
                # One statement per MailboxShard batch.
                rows = [(tenant, u, pos, seq, cid, special.get(u, refs.flags)) for u in refs.shards[shard]]
                con.executemany("INSERT OR IGNORE INTO mailbox VALUES (?, ?, ?, ?, ?, ?)", rows)
                n += len(rows)
            con.execute(
                "INSERT INTO written VALUES (0, ?) ON CONFLICT(id) DO UPDATE SET pos=max(pos, excluded.pos)", (pos,)
            )
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:  # SQLite may have rolled it back (a full disk)
                con.execute("ROLLBACK")
            raise
        return n

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        rows = (
            self._reader()
            .execute(
                "SELECT user_id, pos, conversation_seq, conversation_id, flags FROM mailbox "
                "WHERE tenant=? AND user_id=? AND pos>? AND pos<=? ORDER BY pos LIMIT ?",
                (tenant, user_id, after, until, limit),
            )
            .fetchall()
        )
        return [tuple(r) for r in rows]

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        for r in self._reader().execute(
            "SELECT tenant, user_id, pos, conversation_seq, conversation_id, flags FROM mailbox "
            "ORDER BY tenant, user_id, pos"
        ):
            yield tuple(r)

    def written(self) -> int | None:
        row = self._reader().execute("SELECT pos FROM written").fetchone()
        return None if row is None else int(row[0])

    def sort_key(self, tenant: str, user_id: str, pos: int) -> tuple[str, str, int]:
        return (tenant, user_id, pos)

    def count(self) -> int:
        return int(self._reader().execute("SELECT count(*) FROM mailbox").fetchone()[0])

    def flush(self) -> None:
        pass  # each write_shards commits; synchronous=NORMAL in WAL is durable across process crashes

    def reopen(self) -> None:
        pass  # SQLite recovers from a failed write by itself (the transaction rolled back)

    def close(self) -> None:
        self._write.close()
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
