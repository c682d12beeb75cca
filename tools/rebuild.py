"""Rebuild and verify the read side from the log (SPEC section 6: `fanout rebuild`,
`fanout verify`).

Both hold the data-dir lock, catch the live views up to the end of the log, then
project the whole log again ASIDE into `rebuild-views.sqlite` + `rebuild-mailbox.rocksdb` (or a scratch dir for
verify) with a runner restricted to the selected targets and without effects (no
online push, no review trigger). `rebuild` then swaps the result in; `verify`
diffs it against the live views.

How a store is swapped in or compared is the engine's (the AsideBuilds port;
SQLite + RocksDB: adapters/sqlite/rebuild.py). Runtime facts (`delivery.materialized_at`,
`delivery.online_pushes`) describe the first delivery: a rebuild carries the live
values over, verify ignores them.

Why this module is long: `fanout rebuild` and `fanout verify` on both engines share the build
aside, the progress bars and the comparison; the engine-specific steps are behind the
AsideBuilds of each adapter package."""

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

from domain.params import Parameters
from fanout.bootstrap import bootstrap, open_views, rebuild_host, sqlite_aside_builds
from fanout.embedded import EmbeddedRuntime
from projections.delivery import DeliveryProjection
from projections.ports import ALL_TARGETS, AsideBuilds, StaleAside, ViewStore

TARGETS: dict[str, frozenset[str]] = {
    "all": ALL_TARGETS,
    "mailbox": frozenset({"mailbox"}),
    "state": frozenset({"state"}),
    "heads": frozenset({"heads"}),
}

REBUILD_PREFIX = "rebuild-"
ASIDE: AsideBuilds = sqlite_aside_builds()  # the engine of the views bootstrap opens


class RebuildError(RuntimeError):
    pass


@dataclass
class RebuildResult:
    target: str
    position: int
    rows: dict[str, int]
    seconds: float
    # distributed: table -> (rows upserted, rows deleted) by the merge into the live table
    changed: dict[str, tuple[int, int]] = field(default_factory=dict)


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
    targets: frozenset[str],
    progress: Progress | None = None,
) -> ViewStore:
    """Project the whole log from position 0 into fresh views at directory/prefix*.

    With a subset of targets the writer skips the other tables, but the projection
    still keeps its whole in-memory model, so building from 0 needs nothing else."""
    ASIDE.remove(directory, prefix)
    aside = open_views(directory, rt.params.mailbox_shards, prefix=prefix)
    runner = rebuild_host(rt.app, aside, rt.params, targets=targets)
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
    targets = TARGETS[target]
    data_dir = Path(data_dir)
    if not (data_dir / "events.sqlite").exists():
        raise RebuildError(f"{data_dir} has no event store (events.sqlite); nothing to rebuild from")
    started = time.monotonic()
    rt = bootstrap(params, data_dir, lock=True)  # raises DataDirBusy while serve runs
    try:
        with _bar("catch up live views", rt.runner.position(), rt.runner.log_position(), progress, out) as bar:
            catch_up_live(rt, bar)
        with _bar(f"rebuild {target}", 0, rt.runner.log_position(), progress, out) as bar:
            aside = build_aside(rt, data_dir, REBUILD_PREFIX, targets, bar)
        position = aside.position(DeliveryProjection.name)
        live_position = rt.views.position(DeliveryProjection.name)
        aside.close()
        if position != live_position:
            raise RebuildError(f"rebuilt position {position} differs from the live position {live_position}")
        # Close the live connections before touching the files or tables they hold.
        rt.views.close()
        try:
            ASIDE.swap(data_dir, REBUILD_PREFIX, target, targets)
        except StaleAside as exc:
            raise RebuildError(str(exc)) from None
        rows = _rows(data_dir, target, targets, params)
    finally:
        ASIDE.remove(data_dir, REBUILD_PREFIX)
        rt.close()
    return RebuildResult(target, position, rows, time.monotonic() - started)


def _rows(data_dir: Path, target: str, targets: frozenset[str], params: Parameters) -> dict[str, int]:
    """What the swapped-in views hold: rows per table rebuilt, and the mailbox entries."""
    tables = list(ASIDE.tables) if target == "all" else [] if target == "mailbox" else ASIDE.tables_of(targets)
    views = open_views(data_dir, params.mailbox_shards)
    try:
        rows = ASIDE.rows(data_dir, tables)
        if "mailbox" in targets:
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
            aside = build_aside(rt, scratch, "", ALL_TARGETS, bar)
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


# -- the distributed runtime (PostgreSQL log, Cassandra views) ------------------------------
#
# The views are built aside from the PostgreSQL log into another keyspace of the same
# cluster, up to the position P the live views hold, and compared with the live keyspace
# (verify) or merged into it (rebuild): docs/adr/0016-rebuild-on-cassandra.md. P is one
# position only when every log partition has applied the same one (each partition's last
# relay watermark): a views store whose partitions stand at different positions holds
# events past the lowest of them, which no single position of the log describes.

SETTLE_TIMEOUT = 60.0  # seconds verify waits for the partitions to stand at one position
# A build aside that fails (Cassandra busy: a WriteTimeout) resumes from its tracked position,
# as a worker's unit does; this many attempts in all, a second more between each.
BUILD_ATTEMPTS = 5
VERIFY_SUFFIX = "_verify_"
REBUILD_SUFFIX = "_rebuild"


def _aside_keyspace(live: str, suffix: str) -> str:
    return f"{live[: 48 - len(suffix)]}{suffix}"


def one_position(positions: dict[tuple[str, int], int], partitions: int) -> tuple[int, int]:
    """(lowest, highest) position over the log partitions and the projections a worker tracks."""
    from projections.hosting import PROJECTIONS

    values = [positions.get((name, p), 0) for name in PROJECTIONS for p in range(partitions)]
    return min(values), max(values)


def _settled(aside: Any, partitions: int, timeout: float, err: TextIO, progress: bool) -> dict[tuple[str, int], int]:
    """The live tracking positions once every partition stands at one position."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        positions = aside.positions()
        lo, hi = one_position(positions, partitions)
        if lo == hi:
            return dict(positions)
        if time.monotonic() >= deadline:
            raise RebuildError(
                f"the views are not at one log position (partitions between {lo} and {hi} after {timeout:.0f} s): "
                "the workers are applying events. Let them catch up with no traffic, or stop the relay, let the "
                "workers drain, stop them, and run this again"
            )
        if progress and not said:
            print(f"waiting for the views' partitions to stand at one position ({lo}..{hi})", file=err, flush=True)
            said = True
        time.sleep(0.5)


def _build_distributed(
    settings: Any, app: Any, keyspace: str, top: int, targets: frozenset[str], desc: str, progress: bool, out: TextIO
) -> Any:
    """Project positions 1..top of the PostgreSQL log into a fresh keyspace (its tables
    created by the Cassandra views adapter), no effects; returns those views (open)."""
    from fanout.bootstrap import open_distributed_views

    store = open_distributed_views(settings, keyspace=keyspace)
    try:
        runner = rebuild_host(app, store, settings.params, targets=targets, until=top)
        with _bar(desc, 0, top, progress, out) as bar:
            for attempt in range(1, BUILD_ATTEMPTS + 1):
                try:
                    runner.catch_up(lambda _n: bar(runner.position(), top))
                    break
                except Exception as exc:  # a unit is idempotent: the next attempt resumes at its tracking
                    if attempt == BUILD_ATTEMPTS:
                        raise
                    print(
                        f"\nthe build aside failed at position {runner.position()} ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); again in {attempt} s (attempt {attempt + 1} of {BUILD_ATTEMPTS})",
                        file=out,
                        flush=True,
                    )
                    time.sleep(attempt)
        built = runner.position()
        if built != top:
            raise RebuildError(f"the build aside stopped at position {built} of {top}")
    except BaseException:
        store.close()
        raise
    return store


def _table_progress(progress: bool, out: TextIO, what: str) -> Callable[[str, int], None] | None:
    if not progress:
        return None
    shown: dict[str, float] = {}
    tty = out.isatty()

    def report(table: str, n: int) -> None:
        """On a terminal one line rewritten; else a line when a table starts, then every 10 s."""
        now = time.monotonic()
        if tty and now - shown.get(table, 0.0) > 0.5:
            print(f"\r{what} {table}: {n:,} rows".ljust(60), end="", file=out, flush=True)
            shown[table] = now
        elif not tty and now - shown.get(table, -60.0) > 10.0:
            print(f"{what} {table}: {n:,} rows so far", file=out, flush=True)
            shown[table] = now

    return report


def verify_distributed(
    settings: Any,
    *,
    limit: int = 10,
    progress: bool = True,
    out: TextIO | None = None,
    settle_timeout: float = SETTLE_TIMEOUT,
) -> VerifyResult:
    """Project the PostgreSQL log into a scratch keyspace up to the position the live
    Cassandra views hold, and compare the two table by table (runtime facts ignored).
    Runs beside the workers when no event is being applied (it waits up to
    `settle_timeout` for the partitions to stand at one position, and fails if they moved
    while it ran); with traffic, stop the relay first."""
    import uuid

    from fanout.bootstrap import cassandra_aside_builds, log_partitions, open_application_for, open_distributed_views

    out = sys.stderr if out is None else out  # the stream at call time (not at import)
    started = time.monotonic()
    partitions = log_partitions(settings)
    app = open_application_for(settings)
    live = open_distributed_views(settings)
    aside = cassandra_aside_builds(live)
    scratch = _aside_keyspace(live.keyspace, VERIFY_SUFFIX + uuid.uuid4().hex[:8])
    built: Any = None
    try:
        before = _settled(aside, partitions, settle_timeout, out, progress)
        top = one_position(before, partitions)[0]
        if top > (app.recorder.max_notification_id() or 0):
            raise RebuildError(f"the views are at position {top}, past the end of the log: wrong FANOUT_EVENT_STORE?")
        built = _build_distributed(settings, app, scratch, top, ALL_TARGETS, "recompute", progress, out)
        built.close()
        built = None
        tables = aside.diff(scratch, limit, _table_progress(progress, out, "compare"))
        if progress and out.isatty():
            print(file=out)
        after = aside.positions()
        if after != before:
            lo, hi = one_position(after, partitions)
            raise RebuildError(
                f"the views moved while verify ran (from {top} to {lo}..{hi}): run it with no traffic, or with "
                "the relay stopped and the workers drained"
            )
        result = VerifyResult(position=top, rows={})
        live_pos, new_pos = tables.positions
        if live_pos != new_pos:
            result.differences["tracking"] = ([("delivery", live_pos)], [("delivery", new_pos)])
            result.counts["tracking"] = (1, 1)
        result.rows.update(tables.rows)
        result.differences.update(tables.differences)
        result.counts.update(tables.counts)
    finally:
        if built is not None:
            built.close()
        try:
            aside.remove(scratch)
        finally:
            live.close()
            app.close()
    result.seconds = time.monotonic() - started
    return result


def rebuild_distributed(
    settings: Any,
    target: str,
    *,
    progress: bool = True,
    out: TextIO | None = None,
) -> RebuildResult:
    """Rebuild `target` of the Cassandra views: with every worker stopped and the views'
    partitions at one position P, project the PostgreSQL log 1..P into `<keyspace>_rebuild`,
    then merge its tables into the live ones (upserts, then deletes) and drop it."""
    from fanout.bootstrap import (
        cassandra_aside_builds,
        log_partitions,
        open_application_for,
        open_distributed_views,
        worker_group_members,
    )

    if target not in TARGETS:
        raise RebuildError(f"rebuild target must be one of {', '.join(TARGETS)}")
    targets = TARGETS[target]
    out = sys.stderr if out is None else out
    started = time.monotonic()
    partitions = log_partitions(settings)

    def no_workers() -> None:
        n = worker_group_members(settings)
        if n:
            raise RebuildError(
                f"{n} `fanout worker` process(es) are in the consumer group: stop every worker first "
                "(after letting them drain: stop the relay, wait for the views to reach the log), then run this again"
            )

    no_workers()
    app = open_application_for(settings)
    live = open_distributed_views(settings)
    aside = cassandra_aside_builds(live)
    keyspace = _aside_keyspace(live.keyspace, REBUILD_SUFFIX)
    built: Any = None
    try:
        before = aside.positions()
        top, hi = one_position(before, partitions)
        if top != hi:
            raise RebuildError(
                f"the views' partitions stand at different positions ({top}..{hi}): the workers were stopped "
                "mid-stream. Stop the relay, start the workers until the views reach the log, stop them, run this again"
            )
        aside.remove(keyspace)  # a crashed rebuild's leftovers
        built = _build_distributed(settings, app, keyspace, top, targets, f"rebuild {target}", progress, out)
        built.close()
        built = None
        no_workers()
        tables = aside.tables_of(targets)
        try:
            merged = aside.swap(keyspace, tables, before, _table_progress(progress, out, "switch"))
        except StaleAside as exc:
            raise RebuildError(str(exc)) from None
        if progress and out.isatty():
            print(file=out)
    finally:
        if built is not None:
            built.close()
        try:
            aside.remove(keyspace)
        finally:
            live.close()
            app.close()
    rows = {t: m.rows for t, m in merged.items()}
    result = RebuildResult(target, top, rows, time.monotonic() - started)
    result.changed = {t: (m.upserted, m.deleted) for t, m in merged.items()}
    return result
