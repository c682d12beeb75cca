"""Rebuild and verify the read side from the log (SPEC section 6: `fanout rebuild`,
`fanout verify`).

Both hold the data-dir lock, catch the live views up to the end of the log, then
project the whole log again ASIDE into `rebuild-views.sqlite` + `rebuild-mailbox.rocksdb` (or a scratch dir for
verify) with a runner restricted to the selected parts and without effects (no
online push, no review trigger). `rebuild` then swaps the result in; `verify`
diffs it against the live views.

How a store is swapped in or compared is the engine's (the AsideBuilds port;
SQLite + RocksDB: adapters/sqlite_rebuild.py). Runtime facts (`delivery.materialized_at`,
`delivery.online_pushes`) describe the first delivery: a rebuild carries the live
values over, verify ignores them."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from adapters.sqlite_rebuild import SqliteAsideBuilds
from domain.params import Parameters
from fanout.bootstrap import EmbeddedRuntime, bootstrap, open_views
from projections.delivery import DeliveryProjection
from projections.ports import ALL_PARTS, AsideBuilds, StaleAside, ViewStore
from streams.embedded import EmbeddedRunner

TARGETS: dict[str, frozenset[str]] = {
    "all": ALL_PARTS,
    "mailbox": frozenset({"mailbox"}),
    "state": frozenset({"state"}),
    "heads": frozenset({"heads"}),
}

REBUILD_PREFIX = "rebuild-"
ASIDE: AsideBuilds = SqliteAsideBuilds()  # the engine of the views bootstrap opens


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
) -> ViewStore:
    """Project the whole log from position 0 into fresh views at directory/prefix*.

    With a subset of parts the writer skips the other tables, but the projection
    still keeps its whole in-memory model, so building from 0 needs nothing else."""
    ASIDE.remove(directory, prefix)
    aside = open_views(directory, rt.params.mailbox_shards, prefix=prefix)
    runner = EmbeddedRunner(rt.app, aside, rt.params, parts=parts)
    top = runner.log_position()
    try:
        runner.catch_up((lambda _n: progress(runner.position(), top)) if progress else None)
    except BaseException:
        aside.close()
        raise
    return aside


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
        try:
            ASIDE.swap(data_dir, REBUILD_PREFIX, target, parts)
        except StaleAside as exc:
            raise RebuildError(str(exc)) from None
        rows = _rows(data_dir, target, parts, params)
    finally:
        ASIDE.remove(data_dir, REBUILD_PREFIX)
        rt.close()
    return RebuildResult(target, position, rows, time.monotonic() - started)


def _rows(data_dir: Path, target: str, parts: frozenset[str], params: Parameters) -> dict[str, int]:
    """What the swapped-in views hold: rows per table rebuilt, and the mailbox entries."""
    tables = list(ASIDE.tables) if target == "all" else [] if target == "mailbox" else ASIDE.tables_of(parts)
    views = open_views(data_dir, params.mailbox_shards)
    try:
        rows = ASIDE.rows(data_dir, tables)
        if "mailbox" in parts:
            rows["mailbox"] = views.mailbox.count()
    finally:
        views.close()
    return rows


# -- verify ------------------------------------------------------------------------------

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
    aside: ViewStore | None = None
    try:
        with _bar("catch up live views", rt.runner.position(), rt.runner.log_position(), progress, out) as bar:
            catch_up_live(rt, bar)
        with _bar("recompute", 0, rt.runner.log_position(), progress, out) as bar:
            aside = build_aside(rt, scratch, "", ALL_PARTS, bar)
        position = aside.position(DeliveryProjection.name)
        result = VerifyResult(position=position, rows={})
        tables = ASIDE.diff(data_dir, scratch, limit)
        live_pos, new_pos = tables.positions
        if live_pos != new_pos:
            result.differences["tracking"] = ([("delivery", live_pos)], [("delivery", new_pos)])
            result.counts["tracking"] = (1, 1)
        result.rows.update(tables.rows)
        result.differences.update(tables.differences)
        result.counts.update(tables.counts)
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
