"""The SQLite connection every store of a data dir opens: autocommit (the stores BEGIN
themselves), WAL for a writer, and the page cache and memory map the views were measured
with (docs/PERFORMANCE.md)."""

from __future__ import annotations

import sqlite3
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
