"""The SQLite connection every store of a data dir opens: autocommit (the stores BEGIN
themselves), WAL for a writer, and the page cache and memory map the views were measured
with (docs/PERFORMANCE.md); and the pool of read-only connections the login's reads borrow
(ReadPool)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path


def connect(path: Path | str, *, readonly: bool = False) -> sqlite3.Connection:
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    con = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30)
    con.row_factory = sqlite3.Row
    con.execute("PRAGMA busy_timeout=30000")
    if not readonly:
        con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("PRAGMA cache_size=-131072")  # 128 MiB
    con.execute("PRAGMA mmap_size=1073741824")
    con.execute("PRAGMA temp_store=MEMORY")
    return con


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
VIEWS_FILE = "views.sqlite"  # the views of a data dir (a set built aside: its prefix before it)
