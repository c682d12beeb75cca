"""The distributed runtime as one API replica sees it: the command side on the shared
PostgreSQL event store, the views in Cassandra written by the Faust workers, online
pushes arriving from the workers through Kafka. Implements `fanout.runtime.Runtime`;
`bootstrap_distributed` (fanout/bootstrap/replica.py) builds it from the SPEC section 8 URLs
and hands it its adapters and its parts (the application, the hub, the backpressure, the clock
guard, the effect handlers; this module imports no engine).

Positions are the event store's notification ids, as in the embedded runtime. The views
hold position P when every log partition has applied everything up to P: the workers
track, per (projection, partition), the last event or relay watermark applied
(streams/records.py), and `views_position` is the minimum over the partitions. The workers
publish the positions each commit left (`ViewsTracked`, on the pushes topic): the replica
learns the views' progress from them, with no query, and wakes the waiters. A watcher
thread still reads the tracking rows every WATCH_INTERVAL, in case such a record is lost (a
worker killed between its commit and its publication, Kafka away), so backpressure checks
and read-your-writes waits cost no query each.

A read of one conversation needs only the partition its events are routed to (`route`,
streams/routing.py, given by the composition root): while some other partition is behind
(its worker stalled or failed over), such a read waits for its own partition's tracked
position, which the watcher then also reads, for the partitions someone waits on only."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

from domain.errors import InvalidArgument
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.clock_guard import ClockGuard
from fanout.overload import Backpressure
from fanout.push import PushHub
from fanout.queries import Queries
from projections.capacity import CapacityProjection
from projections.capacity_monitor import platform_window
from projections.delivery import Delivered, DeliveryProjection
from projections.head_cache import HeadCache
from projections.hosting import Effect, ViewsTracked
from projections.ports import ViewStore

log = logging.getLogger("fanout.distributed")

# seconds between reads of the views' position: the fallback, the workers' ViewsTracked
# records say it first (every 20 ms this cost a replica ~0.2 cores of its own and Cassandra's)
WATCH_INTERVAL = 0.25
POLL_INTERVAL = 0.02  # seconds between reads of the views when the watcher does not run
HEALTH_INTERVAL = 2.0  # seconds between checks of the relay and the workers


class Closeable(Protocol):
    def close(self) -> None: ...


class ReplicaLinks(Protocol):
    """What a replica asks of the log and the workers (built by the composition root:
    `streams/replica_links.py` over Kafka)."""

    def relayed_position(self) -> int:
        """The last event-store position the relay committed to Kafka."""

    def workers(self) -> int:
        """Worker processes alive: their heartbeats reach this replica (0: none)."""

    def worker_partitions(self) -> set[int]:
        """The event topic's partitions the live workers hold."""

    def worker_counters(self) -> dict[str, dict[str, int]]:
        """worker -> its running totals (units, failures, fenced, heals, reread), from its beats."""

    def subscribe_pushes(
        self,
        callback: Callable[[Delivered], None],
        on_tracked: Callable[[ViewsTracked], None] | None = None,
        wants: Callable[[str], bool] | None = None,
    ) -> Closeable:
        """Receive every Delivered the workers publish after their commits (those of the
        tenants `wants` answers True for), and (on_tracked) the positions each commit left in
        the views."""

    def close(self) -> None:
        """Release the clients the checks keep."""


@dataclass
class ViewsProgress:
    """How far this replica knows the views to be (the lowest position every log partition
    has applied), and what stops it knowing (Cassandra away): written by the runtime's
    watchers, read by its backpressure (fanout/overload.py RunnerState) and by the command
    side's view reads (`ViewReads.position`)."""

    committed: int
    last_error: str | None = None
    failure_reason: str | None = None


class DistributedRuntime:
    def __init__(
        self,
        params: Parameters,
        views: ViewStore,
        links: ReplicaLinks,
        app: FanoutApplication,
        *,
        progress: ViewsProgress,
        queries: Queries,
        hub: PushHub,
        backpressure: Backpressure,
        effects: Callable[[Sequence[Effect]], None],
        partitions: int,
        route: Callable[[str, str, int], int] | None = None,
        head_cache: HeadCache | None = None,
        clock_guard: ClockGuard | None = None,
    ) -> None:
        """The parts the composition root built (fanout/bootstrap/replica.py): `app` reads the
        views through `ViewReads`; `effects` acts on the `Delivered` the workers publish (this
        replica's sockets); `clock_guard` holds this replica's clock to the event store's
        (ADR-0041; a gate of `backpressure`)."""
        self.params = params
        # the heads the views' logins read, kept while the workers' records say they hold (ADR-0035);
        # every position this replica learns is told to it before a waiting reader wakes
        self.head_cache = head_cache
        self.views = views
        self.links = links
        self.partitions = partitions
        self.route = route  # (tenant, conversation_id, partitions) -> the log partition of its events
        self.app = app
        self.queries = queries
        self.hub = hub
        self.progress = progress
        self.backpressure = backpressure
        self.clock_guard = clock_guard
        self.started_at = time.time()
        self.health: dict[str, Any] = {}
        # Until live workers have held every partition once, this replica is starting: writes
        # would be accepted that no worker projects yet, so /readyz says not ready.
        self.served = False
        self._progress = threading.Condition()
        # Partitions read waits are parked on (partition -> how many), and the last tracked
        # position the watcher read for each: a partition ahead of the views' position answers
        # the reads of its conversations without waiting for the slowest partition.
        self._wanted: dict[int, int] = {}
        self._partition_positions: dict[int, int] = {}
        # partition -> the delivery position the last ViewsTracked of a worker's commit reported
        self._published: dict[int, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pushes: Closeable | None = None
        self._effects = effects

    review_triggers = 0  # opened by the workers' capacity projections, not here

    @property
    def committed(self) -> int:
        return self.progress.committed

    @committed.setter
    def committed(self, position: int) -> None:
        self.progress.committed = position

    @property
    def last_error(self) -> str | None:
        return self.progress.last_error

    @last_error.setter
    def last_error(self, error: str | None) -> None:
        self.progress.last_error = error

    @property
    def failure_reason(self) -> str | None:
        return self.progress.failure_reason

    @failure_reason.setter
    def failure_reason(self, reason: str | None) -> None:
        self.progress.failure_reason = reason

    # -- what the workers say -----------------------------------------------------------

    def _on_tracked(self, tracked: ViewsTracked) -> None:
        """A worker's commit left these positions in the views: waiters wake now (after
        the head cache dropped the heads the commit wrote)."""
        if self.head_cache is not None:
            self.head_cache.on_tracked(tracked)
        with self._progress:
            self._published.update(tracked.positions)
            if len(self._published) >= self.partitions:
                low = min(self._published.get(p, 0) for p in range(self.partitions))
                self.committed = max(self.committed, low)
            self._progress.notify_all()

    # -- the watchers ----------------------------------------------------------------------

    def _watch_views_position(self) -> None:
        """The views' position, read a few times a second; wakes the waiters."""
        while not self._stop.is_set():
            try:
                committed = self.views.views_position(DeliveryProjection.name)
                if self.failure_reason == "views_unreachable":
                    self.last_error = self.failure_reason = None
            except Exception as exc:  # Cassandra away: writes are refused (backpressure) until it answers
                self.last_error, self.failure_reason = f"views: {type(exc).__name__}: {exc}", "views_unreachable"
                self._stop.wait(1.0)
                continue
            partitions = self._read_wanted_partitions()
            if self.head_cache is not None:
                self._tell_head_cache(partitions, committed)
            with self._progress:
                for p in set(self._partition_positions) - self._wanted.keys():  # read afresh when waited on again
                    del self._partition_positions[p]
                moved = {p: pos for p, pos in partitions.items() if self._partition_positions.get(p) != pos}
                if len(self._published) >= self.partitions:  # what the workers said may be newer than this read
                    committed = max(committed, min(self._published.get(p, 0) for p in range(self.partitions)))
                if committed != self.committed or moved:
                    self.committed = committed
                    self._partition_positions.update(moved)
                    self._progress.notify_all()
            self._stop.wait(WATCH_INTERVAL)

    def _tell_head_cache(self, partitions: dict[int, int], committed: int) -> None:
        """What the watcher read, to the head cache before any reader wakes on it; the first
        time, the positions its chains start from (the push subscriber started before)."""
        assert self.head_cache is not None
        if not self.head_cache.ready:
            try:
                tracked = self.views.positions()
            except Exception:  # Cassandra away: at the next tick
                return
            self.head_cache.establish({p: pos for (name, p), pos in tracked.items() if name == DeliveryProjection.name})
        self.head_cache.saw(partitions, every=committed)

    def _read_wanted_partitions(self) -> dict[int, int]:
        """The tracked position of each partition a read waits on now (one row each)."""
        with self._progress:
            wanted = sorted(self._wanted)
        found: dict[int, int] = {}
        for p in wanted:
            try:
                found[p] = self.views.position(DeliveryProjection.name, p)
            except Exception:  # the views' position's read answered a moment ago: again at the next tick
                continue
        return found

    def _check_health(self) -> None:
        while not self._stop.is_set():
            self.health = self.check()
            self._stop.wait(HEALTH_INTERVAL)

    def check(self) -> dict[str, Any]:
        """Each engine and the projection host, as /readyz reports them."""
        out: dict[str, Any] = {}
        for name, probe in (
            ("event_store", self.app.log_position),
            ("relay_position", self.links.relayed_position),
            ("workers", self.links.workers),
            ("views_position", lambda: self.views.views_position(DeliveryProjection.name)),
        ):
            try:
                out[name] = probe()
            except Exception as exc:
                out[name] = None
                out.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:300]
        if self.clock_guard is not None:
            skew = self.clock_guard.measure()
            out["clock_skew_seconds"] = None if skew is None else round(skew, 3)
            if self.clock_guard.over(skew):
                assert skew is not None
                out.setdefault("errors", {})["clock"] = self.clock_guard.describe(skew)
        if out.get("workers"):
            # Held by no live worker: nothing projects them (a rebalance in progress, or too few workers).
            held = self.links.worker_partitions()
            out["unassigned_partitions"] = unassigned = [p for p in range(self.partitions) if p not in held]
            if not unassigned:
                self.served = True
            elif not self.served:  # later (a rebalance, a worker gone) the replica stays ready: it still serves
                out.setdefault("errors", {})["workers"] = f"starting: partitions {unassigned} held by no worker yet"
        return out

    # -- Runtime ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return bool(self._threads) and not self._stop.is_set()

    def position(self, partition: int | None = None) -> int:
        if partition is None:
            return self.committed
        return max(self.committed, self._partition_positions.get(partition, 0), self._published.get(partition, 0))

    def log_position(self) -> int:
        return self.app.log_position()

    def conversation_partition(self, tenant: str, conversation_id: str) -> int | None:
        if self.route is None:
            return None
        try:
            return self.route(tenant, conversation_id, self.partitions)
        except InvalidArgument:  # not a valid id: the read itself says so
            return None

    def wait_until(self, position: int, timeout: float = 30.0, partition: int | None = None) -> bool:
        deadline = time.monotonic() + timeout
        if not self.running:  # no watcher: read the views directly
            while self._read_position(partition) < position:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(POLL_INTERVAL)
            return True
        with self._progress:
            if partition is not None:
                self._wanted[partition] = self._wanted.get(partition, 0) + 1
            try:
                while self.position(partition) < position:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._progress.wait(min(left, 0.1))
            finally:
                if partition is not None:
                    self._wanted[partition] -= 1
                    if not self._wanted[partition]:
                        del self._wanted[partition]
        return True

    def _read_position(self, partition: int | None) -> int:
        """The position of the views (or of one partition of them) read now, remembered."""
        self.committed = max(self.committed, self.views.views_position(DeliveryProjection.name))
        if partition is None:
            read: dict[int, int] = {}
            found = self.committed
        else:
            read = {partition: self.views.position(DeliveryProjection.name, partition)}
            found = max(self.committed, read[partition])
        if self.head_cache is not None:
            self.head_cache.saw(read, every=self.committed)
        return found

    def catch_up(self) -> None:
        self.wait_until(self.log_position(), timeout=120.0)

    def projections_status(self) -> dict[tuple[str, int], int]:
        return self.views.positions()

    def host_counters(self) -> dict[str, dict[str, int]]:
        return self.links.worker_counters()

    def capacity(self) -> CapacityProjection:
        return platform_window(self.params, self.views, self.partitions)

    def mailbox_cost(self) -> tuple[float | None, int]:
        """The workers write the mailbox: their heartbeats' totals (ADR-0026), None when none reports them."""
        counters = [c for c in self.host_counters().values() if "mailbox_write_us" in c]
        if not counters:
            return None, 0
        return sum(c["mailbox_write_us"] for c in counters) / 1e6, sum(c.get("mailbox_entries", 0) for c in counters)

    def start(self) -> Self:
        if self.running:
            return self
        if self.clock_guard is not None:
            self.clock_guard.measure()  # before the first send: a replica started off the clock refuses from the start
        # Pushes of a tenant with no socket here are skipped undecoded: push_online, the only
        # Delivered handler of a replica, would push nothing for them.
        self._pushes = self.links.subscribe_pushes(lambda d: self._effects((d,)), self._on_tracked, self.hub.holds)
        for target, name in (
            (self._watch_views_position, "fanout-views-position"),
            (self._check_health, "fanout-health"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        if self._pushes is not None:
            self._pushes.close()
        self.links.close()
        self.hub.close()
        self.views.close()
        self.app.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
