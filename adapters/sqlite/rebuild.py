"""The SQLite + RocksDB side of `fanout rebuild` and `verify` (the AsideBuilds port):
file surgery on a data dir whose views were built aside by the tool.

Swap:
* `all`, `mailbox`: whole stores are replaced (every connection closed first):
  views.sqlite by os.replace (atomic), the mailbox directory (RocksDB,
  mailbox.rocksdb) by two renames: live -> mailbox.rocksdb.old, rebuilt -> live.
  A crash between the two leaves no live mailbox and the old one beside it: rename
  it back, or run the rebuild again.
* `state`, `heads`: the rebuilt tables are copied into the live views.sqlite in one
  transaction (ATTACH, DELETE, INSERT SELECT), so the other targets stay untouched.

Runtime facts: `delivery.materialized_at` and `delivery.online_pushes` describe what
happened when the message was first delivered; a rebuild cannot recompute them. For
rows that exist in the live views, the live values are carried over; rows the live
views lacked keep the rebuild's commit time and no push count. Verify ignores them.

It imports no other store (the RocksDB mailbox is another engine's package): it knows
the file names and the tables of adapters/sqlite/views.py and adapters/rocksdb/mailbox.py
as bootstrap lays them out."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from projections.ports import StaleAside, StoreDiff
from projections.rows import DELIVERY_KEY, DELIVERY_RUNTIME

VIEWS_FILE = "views.sqlite"
MAILBOX_DIR = "mailbox.rocksdb"

# The tables of views.sqlite each part writes (the mailbox lives in mailbox.rocksdb).
TARGET_TABLES: dict[str, tuple[str, ...]] = {
    "state": ("states",),
    "heads": ("heads", "messages", "delivery", "reviews", "tiers"),
}
TABLES: tuple[str, ...] = ("heads", "messages", "states", "delivery", "reviews", "tiers")

# Runtime facts, not derived from the log: ignored by verify, carried over by rebuild.
RUNTIME_COLUMNS = {"delivery": DELIVERY_RUNTIME}
TRACKED = "delivery"  # the projection whose position says how far the views are


class SqliteAsideBuilds:
    tables: tuple[str, ...] = TABLES

    def tables_of(self, targets: frozenset[str]) -> list[str]:
        return [t for p in sorted(targets) for t in TARGET_TABLES.get(p, ())]

    def remove(self, directory: Path, prefix: str) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{directory / prefix}{VIEWS_FILE}{suffix}").unlink(missing_ok=True)
        shutil.rmtree(directory / f"{prefix}{MAILBOX_DIR}", ignore_errors=True)

    def swap(self, data_dir: Path, prefix: str, target: str, targets: frozenset[str]) -> None:
        live_views = data_dir / VIEWS_FILE
        new_views = data_dir / f"{prefix}{VIEWS_FILE}"
        if target not in ("all", "mailbox"):
            self._copy_tables(live_views, new_views, self.tables_of(targets))
            return
        if target == "all":
            if live_views.exists():
                with _attached(new_views, live_views, "live") as con:
                    _carry_runtime_facts(con, "delivery", "live.delivery")
            _checkpoint_single_file(new_views)
            if live_views.exists():
                _checkpoint_single_file(live_views)
            # The old WAL must never be replayed onto the new file.
            for suffix in ("-wal", "-shm"):
                Path(f"{live_views}{suffix}").unlink(missing_ok=True)
            os.replace(new_views, live_views)
        live, new, old = (data_dir / MAILBOX_DIR, data_dir / f"{prefix}{MAILBOX_DIR}",
                          data_dir / f"{MAILBOX_DIR}.old")  # fmt: skip
        shutil.rmtree(old, ignore_errors=True)
        if live.exists():
            os.replace(live, old)
        os.replace(new, live)
        shutil.rmtree(old, ignore_errors=True)

    def _copy_tables(self, live_views: Path, new_views: Path, tables: list[str]) -> None:
        with _attached(live_views, new_views, "r") as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                if _tracked(con, "main") != _tracked(con, "r"):
                    raise StaleAside("the live views moved during the rebuild; nothing was swapped")
                for table in tables:
                    if table == "delivery":
                        con.execute("CREATE TEMP TABLE old_delivery AS SELECT * FROM main.delivery")
                    con.execute(f"DELETE FROM main.{table}")
                    con.execute(f"INSERT INTO main.{table} SELECT * FROM r.{table}")
                    if table == "delivery":
                        _carry_runtime_facts(con, "delivery", "temp.old_delivery")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def rows(self, data_dir: Path, tables: list[str]) -> dict[str, int]:
        con = _connect(data_dir / VIEWS_FILE)
        try:
            return {table: _count(con, table) for table in tables}
        finally:
            con.close()

    def diff(self, live: Path, rebuilt: Path, limit: int) -> StoreDiff:
        with _attached(live / VIEWS_FILE, rebuilt / VIEWS_FILE, "r") as con:
            result = StoreDiff(positions=(_tracked(con, "main"), _tracked(con, "r")), rows={})
            for table in self.tables:
                cols = [c for c in _columns(con, table) if c not in RUNTIME_COLUMNS.get(table, ())]
                result.rows[table] = _count(con, table)
                _diff(con, table, cols, limit, result)
        return result


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, timeout=30)
    con.execute("PRAGMA busy_timeout=30000")
    return con


@contextmanager
def _attached(path: Path, other: Path, alias: str) -> Iterator[sqlite3.Connection]:
    con = _connect(path)
    try:
        con.execute(f"ATTACH DATABASE ? AS {alias}", (str(other),))
        yield con
    finally:
        con.close()


def _checkpoint_single_file(path: Path) -> None:
    """Fold the WAL into the main file and leave one self-contained file behind."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
    finally:
        con.close()


def _count(con: sqlite3.Connection, table: str, schema: str = "main") -> int:
    return int(con.execute(f"SELECT count(*) FROM {schema}.{table}").fetchone()[0])


def _columns(con: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA {schema}.table_info({table})")]


def _tracked(con: sqlite3.Connection, schema: str) -> int:
    row = con.execute(f"SELECT position FROM {schema}.tracking WHERE projection=?", (TRACKED,)).fetchone()
    return int(row[0]) if row else 0


def _carry_runtime_facts(con: sqlite3.Connection, target: str, source: str) -> None:
    """delivery.materialized_at / online_pushes of the table `source` onto the same rows of `target`."""
    cols = RUNTIME_COLUMNS["delivery"]
    key = " AND ".join(f"{target}.{k} = o.{k}" for k in DELIVERY_KEY)
    con.execute(f"UPDATE {target} SET {', '.join(f'{c} = o.{c}' for c in cols)} FROM {source} AS o WHERE {key}")


def _diff(con: sqlite3.Connection, table: str, cols: list[str], limit: int, result: StoreDiff) -> None:
    select = ", ".join(cols)
    order = ", ".join(str(i + 1) for i in range(len(cols)))
    sides = []
    counts = []
    for a, b in (("main", "r"), ("r", "main")):
        query = f"SELECT {select} FROM {a}.{table} EXCEPT SELECT {select} FROM {b}.{table}"
        counts.append(int(con.execute(f"SELECT count(*) FROM ({query})").fetchone()[0]))
        sides.append([tuple(r) for r in con.execute(f"{query} ORDER BY {order} LIMIT ?", (limit,))])
    if counts[0] or counts[1]:
        result.differences[table] = (sides[0], sides[1])
        result.counts[table] = (counts[0], counts[1])
