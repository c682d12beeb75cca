"""Rebuild and verify the read side from the log (SPEC section 6: `fanout rebuild`,
`fanout verify`).

Both hold the data-dir lock, catch the live views up to the end of the log, then
project the whole log again ASIDE into `rebuild-views.sqlite` + `rebuild-mailbox.rocksdb` (or a scratch dir for
verify) with a runner restricted to the selected parts and without effects (no
online push, no review trigger). `rebuild` then swaps the result in; `verify`
diffs it against the live views.

Swap:
* `all`, `mailbox`: whole stores are replaced after every connection is closed:
  views.sqlite by os.replace (atomic), the mailbox directory (RocksDB,
  mailbox.rocksdb) by two renames: live -> mailbox.rocksdb.old, rebuilt -> live.
  A crash between the two leaves no live mailbox and the old one beside it: rename
  it back, or run the rebuild again.
* `state`, `heads`: the rebuilt tables are copied into the live views.sqlite in one
  transaction (ATTACH, DELETE, INSERT SELECT), so the other parts stay untouched.

Runtime facts: `delivery.materialized_at` and `delivery.online_pushes` describe what
happened when the message was first delivered (when its entries first became durable,
how many sockets were written); a rebuild cannot recompute them. For rows that exist
in the live views, the live values are carried over; rows the live views lacked keep
the rebuild's commit time and no push count."""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from adapters.sqlite_views import ALL_PARTS, SqliteViews, connect
from domain.params import Parameters
from fanout.bootstrap import EmbeddedRuntime, bootstrap, open_views
from projections.delivery import DeliveryProjection
from streams.embedded import EmbeddedRunner

TARGETS: dict[str, frozenset[str]] = {
    "all": ALL_PARTS,
    "mailbox": frozenset({"mailbox"}),
    "state": frozenset({"state"}),
    "heads": frozenset({"heads"}),
}

# The tables of views.sqlite each part writes (the mailbox lives in mailbox.rocksdb).
PART_TABLES: dict[str, tuple[str, ...]] = {
    "state": ("states",),
    "heads": ("heads", "messages", "delivery", "reviews", "tiers"),
}

# Runtime facts, not derived from the log: ignored by verify, carried over by rebuild.
RUNTIME_COLUMNS = {"delivery": ("materialized_at", "online_pushes")}
DELIVERY_KEY = ("tenant", "conversation_id", "conversation_seq")

REBUILD_PREFIX = "rebuild-"
VIEWS_FILE = "views.sqlite"
MAILBOX_DIR = "mailbox.rocksdb"


class RebuildError(RuntimeError):
    pass


@dataclass
class RebuildResult:
    target: str
    position: int
    rows: dict[str, int]
    seconds: float


@dataclass
class VerifyResult:
    position: int
    rows: dict[str, int]
    # table -> (only in the live views, only in the recomputed views), first N rows each
    differences: dict[str, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]] = field(default_factory=dict)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def equal(self) -> bool:
        return not self.differences


Progress = Callable[[int, int], None]  # (position, log position)


# -- building aside -----------------------------------------------------------------


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _remove_aside(directory: Path, prefix: str) -> None:
    _remove_db(directory / f"{prefix}{VIEWS_FILE}")
    shutil.rmtree(directory / f"{prefix}{MAILBOX_DIR}", ignore_errors=True)


def catch_up_live(rt: EmbeddedRuntime, progress: Progress | None = None) -> int:
    """Bring the live views to the end of the log (with their normal effects)."""
    top = rt.runner.log_position()
    rt.runner.catch_up((lambda _n: progress(rt.runner.position(), top)) if progress else None)
    return rt.runner.position()


def build_aside(
    rt: EmbeddedRuntime,
    directory: Path,
    prefix: str,
    parts: frozenset[str],
    progress: Progress | None = None,
) -> SqliteViews:
    """Project the whole log from position 0 into fresh views at directory/prefix*.

    With a subset of parts the writer skips the other tables, but the projection
    still keeps its whole in-memory model, so building from 0 needs nothing else."""
    _remove_aside(directory, prefix)
    aside = open_views(directory, rt.params.mailbox_shards, prefix=prefix)
    runner = EmbeddedRunner(rt.app, aside, rt.params, parts=parts)
    top = runner.log_position()
    try:
        runner.catch_up((lambda _n: progress(runner.position(), top)) if progress else None)
    except BaseException:
        aside.close()
        raise
    return aside


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


@contextmanager
def _attached(path: Path, other: Path, alias: str) -> Iterator[sqlite3.Connection]:
    con = connect(path)
    try:
        con.execute(f"ATTACH DATABASE ? AS {alias}", (str(other),))
        yield con
    finally:
        con.close()


def _tracked(con: sqlite3.Connection, schema: str) -> int:
    row = con.execute(
        f"SELECT position FROM {schema}.tracking WHERE projection=?", (DeliveryProjection.name,)
    ).fetchone()
    return int(row[0]) if row else 0


def _carry_runtime_facts(con: sqlite3.Connection, target: str, source: str) -> None:
    """delivery.materialized_at / online_pushes of the table `source` onto the same rows of `target`."""
    cols = RUNTIME_COLUMNS["delivery"]
    key = " AND ".join(f"{target}.{k} = o.{k}" for k in DELIVERY_KEY)
    con.execute(f"UPDATE {target} SET {', '.join(f'{c} = o.{c}' for c in cols)} FROM {source} AS o WHERE {key}")


# -- rebuild ---------------------------------------------------------------------------


def rebuild(
    data_dir: Path,
    params: Parameters,
    target: str,
    *,
    progress: bool = True,
    out: TextIO = sys.stderr,
) -> RebuildResult:
    if target not in TARGETS:
        raise RebuildError(f"rebuild target must be one of {', '.join(TARGETS)}")
    parts = TARGETS[target]
    data_dir = Path(data_dir)
    if not (data_dir / "events.sqlite").exists():
        raise RebuildError(f"{data_dir} has no event store (events.sqlite); nothing to rebuild from")
    started = time.monotonic()
    rt = bootstrap(params, data_dir, lock=True)  # raises DataDirBusy while serve runs
    try:
        with _bar("catch up live views", rt.runner.position(), rt.runner.log_position(), progress, out) as bar:
            catch_up_live(rt, bar)
        with _bar(f"rebuild {target}", 0, rt.runner.log_position(), progress, out) as bar:
            aside = build_aside(rt, data_dir, REBUILD_PREFIX, parts, bar)
        position = aside.position(DeliveryProjection.name)
        live_position = rt.views.position(DeliveryProjection.name)
        aside.close()
        if position != live_position:
            raise RebuildError(f"rebuilt position {position} differs from the live position {live_position}")
        # Close the live connections before touching the files or tables they hold.
        rt.views.close()
        rows = _swap(data_dir, target, parts, params)
    finally:
        _remove_aside(data_dir, REBUILD_PREFIX)
        rt.close()
    return RebuildResult(target, position, rows, time.monotonic() - started)


def _swap(data_dir: Path, target: str, parts: frozenset[str], params: Parameters) -> dict[str, int]:
    live_views = data_dir / VIEWS_FILE
    new_views = data_dir / f"{REBUILD_PREFIX}{VIEWS_FILE}"
    tables: list[str]
    if target in ("all", "mailbox"):
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
        live, new, old = (data_dir / MAILBOX_DIR, data_dir / f"{REBUILD_PREFIX}{MAILBOX_DIR}",
                          data_dir / f"{MAILBOX_DIR}.old")  # fmt: skip
        shutil.rmtree(old, ignore_errors=True)
        if live.exists():
            os.replace(live, old)
        os.replace(new, live)
        shutil.rmtree(old, ignore_errors=True)
        tables = ["heads", "messages", "states", "delivery", "reviews", "tiers"] if target == "all" else []
    else:
        tables = [t for p in sorted(parts) for t in PART_TABLES[p]]
        with _attached(live_views, new_views, "r") as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                if _tracked(con, "main") != _tracked(con, "r"):
                    raise RebuildError("the live views moved during the rebuild; nothing was swapped")
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
    views = open_views(data_dir, params.mailbox_shards)
    try:
        con = views.reader()
        rows = {table: _count(con, table) for table in tables}
        if "mailbox" in parts:
            rows["mailbox"] = views.mailbox.count()
    finally:
        views.close()
    return rows


# -- verify ------------------------------------------------------------------------------

VERIFIED_TABLES = ("heads", "messages", "states", "delivery", "reviews", "tiers")


def verify(
    data_dir: Path,
    params: Parameters,
    *,
    limit: int = 10,
    progress: bool = True,
    out: TextIO = sys.stderr,
) -> VerifyResult:
    """Recompute everything from the log into a scratch dir and diff it with the live views."""
    data_dir = Path(data_dir)
    if not (data_dir / "events.sqlite").exists():
        raise RebuildError(f"{data_dir} has no event store (events.sqlite); nothing to verify")
    started = time.monotonic()
    rt = bootstrap(params, data_dir, lock=True)
    scratch = Path(tempfile.mkdtemp(prefix=".verify-", dir=data_dir))
    aside: SqliteViews | None = None
    try:
        with _bar("catch up live views", rt.runner.position(), rt.runner.log_position(), progress, out) as bar:
            catch_up_live(rt, bar)
        with _bar("recompute", 0, rt.runner.log_position(), progress, out) as bar:
            aside = build_aside(rt, scratch, "", ALL_PARTS, bar)
        position = aside.position(DeliveryProjection.name)
        result = VerifyResult(position=position, rows={})
        with _attached(data_dir / VIEWS_FILE, scratch / VIEWS_FILE, "r") as con:
            live_pos, new_pos = _tracked(con, "main"), _tracked(con, "r")
            if live_pos != new_pos:
                result.differences["tracking"] = ([("delivery", live_pos)], [("delivery", new_pos)])
                result.counts["tracking"] = (1, 1)
            for table in VERIFIED_TABLES:
                cols = [c for c in _columns(con, table) if c not in RUNTIME_COLUMNS.get(table, ())]
                result.rows[table] = _count(con, table)
                _diff(con, table, cols, limit, result)
        _diff_mailbox(rt.views.mailbox, aside.mailbox, limit, result)
    finally:
        if aside is not None:
            aside.close()
        shutil.rmtree(scratch, ignore_errors=True)
        rt.close()
    result.seconds = time.monotonic() - started
    return result


def _diff_mailbox(live: Any, rebuilt: Any, limit: int, result: VerifyResult) -> None:
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
            note(0, a)  # type: ignore[arg-type]
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


def _diff(con: sqlite3.Connection, table: str, cols: list[str], limit: int, result: VerifyResult) -> None:
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


# -- progress ------------------------------------------------------------------------------


@contextmanager
def _bar(desc: str, start: int, end: int, enabled: bool, out: TextIO) -> Iterator[Progress]:
    """A tqdm bar over log positions start..end; yields update(position, _top)."""
    from tqdm import tqdm

    bar = tqdm(total=max(end - start, 0), desc=desc, unit="ev", file=out, disable=not enabled, dynamic_ncols=True)

    def update(position: int, _top: int) -> None:
        bar.update(max(0, min(position, end) - start - bar.n))

    try:
        yield update
        bar.update(max(0, bar.total - bar.n))
    finally:
        bar.close()
