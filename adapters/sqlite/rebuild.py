"""The SQLite + RocksDB side of `fanout rebuild` and `verify` (the AsideBuilds port):
file surgery on a data dir whose views were built aside by the tool. A name built aside
is the files `<name>-views.sqlite` and `<name>-mailbox.rocksdb` beside the live ones.

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
the file names and the tables of adapters/sqlite/schema.py and adapters/rocksdb/mailbox.py
as bootstrap lays them out, opens views through the function the composition root gives
it, and compares two mailboxes through the MailboxStore port. The tool holds the data
dir's lock throughout; the live views given are open (their mailbox is the only handle
RocksDB allows). A swap of whole stores closes them first; what needs them after that
opens the swapped-in ones, which close() closes."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from adapters.sqlite.errors import sqlite_boundary
from projections.ports import ALL_TARGETS, AsideProgress, MailboxStore, StaleAside, StoreDiff, Swapped, ViewStore
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


@sqlite_boundary
class SqliteAsideBuilds:
    tables: tuple[str, ...] = (*TABLES, "mailbox")

    def __init__(self, data_dir: Path, live: ViewStore, open_views: Callable[[str], ViewStore]) -> None:
        self.data_dir = Path(data_dir)
        self._live: ViewStore | None = live  # the live views, open (None: closed by a swap)
        self._reopened = False  # whether _live was opened here (after a swap): close() closes it
        self._open_views = open_views  # file prefix -> the views (and mailbox) of those files

    def live(self) -> ViewStore:
        if self._live is None:
            self._live, self._reopened = self._open_views(""), True
        return self._live

    def close(self) -> None:
        if self._live is not None and self._reopened:
            self._live.close()
        self._live = None

    def tables_of(self, targets: frozenset[str]) -> list[str]:
        tables = [t for p in sorted(targets) for t in TARGET_TABLES.get(p, ())]
        return [*tables, "mailbox"] if "mailbox" in targets else tables

    def _views_file(self, name: str | None) -> Path:
        return self.data_dir / (VIEWS_FILE if name is None else f"{name}-{VIEWS_FILE}")

    def open(self, name: str) -> ViewStore:
        self.remove(name)
        return self._open_views(f"{name}-")

    def remove(self, name: str) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self._views_file(name)}{suffix}").unlink(missing_ok=True)
        shutil.rmtree(self.data_dir / f"{name}-{MAILBOX_DIR}", ignore_errors=True)

    def positions(self, name: str | None = None) -> dict[tuple[str, int], int]:
        con = _connect(self._views_file(name))
        try:
            return {
                (r[0], int(r[1])): int(r[2])
                for r in con.execute("SELECT projection, partition, position FROM tracking")
            }
        finally:
            con.close()

    def swap(
        self,
        name: str,
        targets: frozenset[str],
        expect: dict[tuple[str, int], int],
        progress: AsideProgress | None = None,
    ) -> dict[str, Swapped]:
        if self.positions() != expect:
            raise StaleAside("the live views moved during the rebuild; nothing was swapped")
        live_views, new_views = self._views_file(None), self._views_file(name)
        tables = self.tables_of(targets)
        if "mailbox" not in targets:
            self._copy_tables(live_views, new_views, tables)
            return self._counted(tables)
        self.live().close()  # whole stores are replaced: no handle may stay on them
        self._live = None
        if targets == ALL_TARGETS:
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
        elif targets != frozenset({"mailbox"}):
            raise ValueError(f"the mailbox is swapped alone or with every target, not with {sorted(targets)}")
        live, new, old = (self.data_dir / MAILBOX_DIR, self.data_dir / f"{name}-{MAILBOX_DIR}",
                          self.data_dir / f"{MAILBOX_DIR}.old")  # fmt: skip
        shutil.rmtree(old, ignore_errors=True)
        if live.exists():
            os.replace(live, old)
        os.replace(new, live)
        shutil.rmtree(old, ignore_errors=True)
        return self._counted(tables)

    def _counted(self, tables: list[str]) -> dict[str, Swapped]:
        """Rows per table of the live views after a swap (the mailbox: entries of its store)."""
        con = _connect(self._views_file(None))
        try:
            out = {t: Swapped(rows=_count(con, t)) for t in tables if t != "mailbox"}
        finally:
            con.close()
        if "mailbox" in tables:
            out["mailbox"] = Swapped(rows=self.live().mailbox.count())
        return out

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
                if con.in_transaction:  # SQLite may have rolled it back (a full disk)
                    con.execute("ROLLBACK")
                raise

    def diff(self, name: str, limit: int, progress: AsideProgress | None = None) -> StoreDiff:
        with _attached(self._views_file(None), self._views_file(name), "r") as con:
            result = StoreDiff(positions=(_tracked(con, "main"), _tracked(con, "r")), rows={})
            for table in TABLES:
                cols = [c for c in _columns(con, table) if c not in RUNTIME_COLUMNS.get(table, ())]
                result.rows[table] = _count(con, table)
                _diff(con, table, cols, limit, result)
                if progress is not None:
                    progress(table, result.rows[table])
        rebuilt = self._open_views(f"{name}-")
        try:
            _diff_mailboxes(self.live().mailbox, rebuilt.mailbox, limit, result)
        finally:
            rebuilt.close()
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


def _diff_mailboxes(live: MailboxStore, rebuilt: MailboxStore, limit: int, result: StoreDiff) -> None:
    """Both stores iterate in their key order: a streaming merge on the store's own key."""

    def key(e: tuple[Any, ...]) -> Any:
        return live.sort_key(e[0], e[1], e[2])

    only_live: list[tuple[Any, ...]] = []
    only_new: list[tuple[Any, ...]] = []
    counts = [0, 0]
    total = 0

    def note(side: int, e: tuple[Any, ...]) -> None:
        counts[side] += 1
        bucket = only_live if side == 0 else only_new
        if len(bucket) < limit:
            bucket.append(e)

    a_it, b_it = iter(live.all_entries()), iter(rebuilt.all_entries())
    a, b = next(a_it, None), next(b_it, None)
    while a is not None or b is not None:
        if b is None or (a is not None and key(a) < key(b)):
            assert a is not None
            note(0, a)
            total += 1
            a = next(a_it, None)
        elif a is None or key(b) < key(a):
            note(1, b)
            b = next(b_it, None)
        else:
            if a != b:  # same key, different value
                note(0, a)
                note(1, b)
            total += 1
            a, b = next(a_it, None), next(b_it, None)
    result.rows["mailbox"] = total
    if counts[0] or counts[1]:
        result.differences["mailbox"] = (only_live, only_new)
        result.counts["mailbox"] = (counts[0], counts[1])
