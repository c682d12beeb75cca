"""Rebuild and verify the read side from the log (SPEC section 6: `fanout rebuild`,
`fanout verify`), one flow for every engine.

Both bring the live views to one log position P, project the log 1..P again ASIDE (views
under another name: files beside the live ones for SQLite + RocksDB, another keyspace of
the cluster for Cassandra) with a projection host restricted to the selected targets and
without effects (no online push, no review trigger). `verify` then compares the two
table by table; `rebuild` swaps the tables of its targets in.

What differs between the engines is behind two seams the composition root fills
(`fanout.bootstrap.open_rebuild_site`): the AsideBuilds port (where a name lives, how it
is compared and swapped: adapters/sqlite/rebuild.py, adapters/cassandra/rebuild.py), and
how the live views reach P (embedded: this process projects them, holding the data dir's
lock; distributed: the workers do, and P is the one position every log partition stands
at: docs/adr/0016-rebuild-on-cassandra.md). Runtime facts (`delivery.materialized_at`,
`online_pushes`, review stamps) describe the first delivery: a rebuild carries the live
values over, verify ignores them.

Why this module is long: `fanout rebuild` and `fanout verify` share the build aside, the
wait for one position, the progress output and the result types; the engines' steps are
behind the port."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from fanout.bootstrap import RebuildSite, open_rebuild_site
from fanout.config import ConfigError, Settings
from projections.delivery import DeliveryProjection
from projections.hosting import PROJECTIONS
from projections.ports import ALL_TARGETS, StaleAside, ViewStore

TARGETS: dict[str, frozenset[str]] = {
    "all": ALL_TARGETS,
    "mailbox": frozenset({"mailbox"}),
    "state": frozenset({"state"}),
    "heads": frozenset({"heads"}),
}

REBUILD_NAME = "rebuild"  # what a rebuild builds aside (a crashed one's leftovers are removed first)
VERIFY_NAME = "verify_"  # + a random suffix: verify may run beside another verify
SETTLE_TIMEOUT = 60.0  # seconds verify waits for the partitions to stand at one position
# A build aside that fails (Cassandra busy: a WriteTimeout) resumes from its tracked position,
# as a worker's unit does; this many attempts in all, a second more between each.
BUILD_ATTEMPTS = 5


class RebuildError(RuntimeError):
    pass


@dataclass
class RebuildResult:
    target: str
    position: int
    rows: dict[str, int]
    seconds: float
    # table -> (rows upserted, rows deleted) where the swap merged into the live table
    # (Cassandra); empty where whole tables were replaced (SQLite + RocksDB)
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


def _site(settings: Settings) -> RebuildSite:
    try:
        return open_rebuild_site(settings)
    except ConfigError as exc:
        raise RebuildError(str(exc)) from None


def one_position(positions: dict[tuple[str, int], int], partitions: int) -> tuple[int, int]:
    """(lowest, highest) position over the log partitions and the projections a host tracks."""
    values = [positions.get((name, p), 0) for name in PROJECTIONS for p in range(partitions)]
    return min(values), max(values)


def _catch_up_live(site: RebuildSite, progress: bool, out: TextIO) -> None:
    """Where this process projects the live views (embedded), to the end of the log."""
    if site.catch_up_live is None:
        return
    top = site.app.recorder.max_notification_id() or 0
    start = one_position(site.aside.positions(), site.partitions)[0]
    with _bar("catch up live views", start, top, progress, out) as bar:
        site.catch_up_live(lambda position: bar(position, top))


def _settled(site: RebuildSite, timeout: float, out: TextIO, progress: bool) -> dict[tuple[str, int], int]:
    """The live tracking positions once every partition stands at one position."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        positions = site.aside.positions()
        lo, hi = one_position(positions, site.partitions)
        if lo == hi:
            return dict(positions)
        if time.monotonic() >= deadline:
            raise RebuildError(
                f"the views are not at one log position (partitions between {lo} and {hi} after {timeout:.0f} s): "
                "the workers are applying events. Let them catch up with no traffic, or stop the relay, let the "
                "workers drain, stop them, and run this again"
            )
        if progress and not said:
            print(f"waiting for the views' partitions to stand at one position ({lo}..{hi})", file=out, flush=True)
            said = True
        time.sleep(0.5)


def build_aside(
    site: RebuildSite, name: str, top: int, targets: frozenset[str], desc: str, progress: bool, out: TextIO
) -> None:
    """Project positions 1..top of the log into fresh views under `name`, the projections
    of `targets` only, no effects. A failed unit (Cassandra busy) is resumed: a unit is
    idempotent, the next attempt starts at its tracked position."""
    store: ViewStore = site.aside.open(name)
    try:
        runner = site.host(store, targets, until=top)
        with _bar(desc, 0, top, progress, out) as bar:
            for attempt in range(1, BUILD_ATTEMPTS + 1):
                try:
                    runner.catch_up(lambda _n: bar(runner.position(), top))
                    break
                except Exception as exc:
                    if attempt == BUILD_ATTEMPTS:
                        raise
                    print(
                        f"\nthe build aside failed at position {runner.position()} ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); again in {attempt} s (attempt {attempt + 1} of {BUILD_ATTEMPTS})",
                        file=out,
                        flush=True,
                    )
                    time.sleep(attempt)
        built = store.position(DeliveryProjection.name)
        if built != top:
            raise RebuildError(f"the build aside stopped at position {built} of {top}")
    finally:
        store.close()


# -- verify ------------------------------------------------------------------------------


def verify(
    settings: Settings,
    *,
    limit: int = 10,
    progress: bool = True,
    out: TextIO | None = None,
    settle_timeout: float = SETTLE_TIMEOUT,
) -> VerifyResult:
    """Project the log into views aside up to the position P the live views hold, and
    compare the two table by table (runtime facts ignored). On the distributed runtime it
    runs beside the workers when no event is being applied (it waits up to
    `settle_timeout` for the partitions to stand at one position, and fails if they moved
    while it ran); with traffic, stop the relay first."""
    out = sys.stderr if out is None else out  # the stream at call time (not at import)
    started = time.monotonic()
    site = _site(settings)
    name = VERIFY_NAME + uuid.uuid4().hex[:8]
    try:
        _catch_up_live(site, progress, out)
        before = _settled(site, settle_timeout, out, progress)
        top = one_position(before, site.partitions)[0]
        if top > (site.app.recorder.max_notification_id() or 0):
            raise RebuildError(f"the views are at position {top}, past the end of the log: wrong FANOUT_EVENT_STORE?")
        build_aside(site, name, top, ALL_TARGETS, "recompute", progress, out)
        tables = site.aside.diff(name, limit, _table_progress(progress, out, "compare"))
        if progress and out.isatty():
            print(file=out)
        after = site.aside.positions()
        if after != before:
            lo, hi = one_position(after, site.partitions)
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
        try:
            site.aside.remove(name)
        finally:
            site.close()
    result.seconds = time.monotonic() - started
    return result


# -- rebuild ---------------------------------------------------------------------------


def rebuild(
    settings: Settings,
    target: str,
    *,
    progress: bool = True,
    out: TextIO | None = None,
) -> RebuildResult:
    """Rebuild `target` of the views: with nothing else writing them and the live views at
    one position P, project the log 1..P aside, then swap the tables of `target` in
    (SQLite + RocksDB: whole files, or the tables in one transaction; Cassandra: a merge of
    upserts, then deletes) and remove what was built aside."""
    if target not in TARGETS:
        raise RebuildError(f"rebuild target must be one of {', '.join(TARGETS)}")
    targets = TARGETS[target]
    out = sys.stderr if out is None else out
    started = time.monotonic()
    site = _site(settings)

    def no_writers() -> None:
        who = site.writers()
        if who:
            raise RebuildError(
                f"{who}: stop every worker first (after letting them drain: stop the relay, wait for the views to "
                "reach the log), then run this again"
            )

    try:
        no_writers()
        _catch_up_live(site, progress, out)
        before = site.aside.positions()
        top, hi = one_position(before, site.partitions)
        if top != hi:
            raise RebuildError(
                f"the views' partitions stand at different positions ({top}..{hi}): the workers were stopped "
                "mid-stream. Stop the relay, start the workers until the views reach the log, stop them, run this again"
            )
        end = site.app.recorder.max_notification_id() or 0
        if top > end:  # the event store lost its tail (an older copy put back): ADR-0056
            if target != "all" or site.catch_up_live is None:
                raise RebuildError(
                    f"the views stand at position {top}, past the end of the event store ({end}): only "
                    "`fanout rebuild all` on the embedded runtime rebuilds them to what the event store holds"
                )
            top = end
        build_aside(site, REBUILD_NAME, top, targets, f"rebuild {target}", progress, out)
        no_writers()
        try:
            swapped = site.aside.swap(REBUILD_NAME, targets, before, _table_progress(progress, out, "switch"))
        except StaleAside as exc:
            raise RebuildError(str(exc)) from None
        if progress and out.isatty():
            print(file=out)
    finally:
        try:
            site.aside.remove(REBUILD_NAME)
        finally:
            site.close()
    result = RebuildResult(target, top, {t: s.rows for t, s in swapped.items()}, time.monotonic() - started)
    result.changed = {
        t: (s.upserted, s.deleted) for t, s in swapped.items() if s.upserted is not None and s.deleted is not None
    }
    return result


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
