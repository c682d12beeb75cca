"""The command unit: an eventsourcing Application whose commands run one at a time, each
deciding on aggregates it loads through `_find` and saving the ones it changed atomically
(`_unit`), run again when that save lost an optimistic-concurrency race (`retried`), and
written with the other commands of a queue in one transaction (`grouped`, ADR-0030). The
commands themselves are `FanoutApplication`'s (fanout/application.py, fanout/tiers.py).

Commands are serialized by one lock per process; aggregates stay in the repository
cache without deep copies, and any failure evicts what it touched, so a half-applied
command can never leak into the next one.

One writer per event store (the embedded runtime) trusts its cache. Several writers on
one store (`shared_store=True`: API replicas on PostgreSQL) retry a command whose save
lost an optimistic-concurrency race (another replica appended to the same stream first):
the command runs again on the fresh aggregate, so the admission gates it checks stay
exact across replicas. What they read (ADR-0023):

* an aggregate the command is about to save is taken from the cache as it is, with no
  fast-forward query: if another replica appended to it meanwhile, the save of the
  decision made on it is refused by the (originator_id, version) key and the command is
  retried on the fresh aggregate. A decision that saves nothing (a refusal, a no-op, a
  duplicate) has no such check, so a command that ends without saving every aggregate it
  took unchecked is decided again on fresh ones (`StaleDecision`);
* an aggregate read for validation only (the conversation a MARK_READ checks, a tier, a
  review's existence...) is fast-forwarded from the store on every load.

Two library methods are overridden for the command thread's CPU (ADR-0036): `save` collects
events without the library's Protocol checks (`fanout/units.py` `Staged`), and
`_take_snapshots` snapshots the aggregate just saved instead of replaying it from the store;
`_record` is wrapped in the crash tests' named steps.

Why this module is long: it is one class, a command's unit from load to save; its parts
(the cache rules, the unit, the group commit, the library overrides) share one lock, one
cache and the group in progress, and apart each would reach into the others' state."""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import RecordConflictError, Recording

from domain.errors import FanoutError, NotFound, Unavailable
from domain.identity import check_tenant
from fanout.overload import storage_unavailable
from fanout.units import Group, GroupBroken, Outcome, Staged, Unit, outcome, project
from projections import failpoints

A = TypeVar("A", bound=Aggregate)
F = TypeVar("F", bound=Callable[..., Any])

CONFLICT_RETRIES = 30  # a command that lost this many races in a row is refused (503); 10 refused a few
# sends of four replicas of one tenant borrowing from each other's quota slots right after a restart
# (tests/distributed/test_quota_slots.py failed 2 runs of 3 at 10)

log = logging.getLogger(__name__)


class StaleDecision(Exception):  # noqa: N818 (control flow inside the application, never raised out of it)
    """A command ended without saving an aggregate it took from the cache unchecked (no
    fast-forward): its outcome (a refusal, a no-op, a duplicate's answer) may rest on a
    stale copy, and no version check will catch it. `retried` runs it again on fresh
    aggregates; `error` is what it raised (None when it returned)."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__("decided on an unchecked cached aggregate; deciding again on fresh ones")
        self.error = error


def retried(method: F) -> F:
    """Run a command again when its save lost an optimistic-concurrency race. `_unit`
    has evicted what the attempt touched, so the next attempt loads the aggregates as
    the winner left them and decides again (a gate that now refuses, refuses). A
    `StaleDecision` runs it again too, every load fast-forwarded this time."""

    @functools.wraps(method)
    def run(self: CommandUnit, *args: Any, **kwargs: Any) -> Any:
        local = self._local
        outer = getattr(local, "fresh", False)
        try:
            for attempt in range(CONFLICT_RETRIES):
                try:
                    return method(self, *args, **kwargs)
                except RecordConflictError:
                    self.conflicts += 1
                    time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # noqa: S311 (jitter, not crypto)
                except StaleDecision:
                    self.stale_decisions += 1
                    local.fresh = True
                    try:
                        return method(self, *args, **kwargs)
                    except RecordConflictError:
                        self.conflicts += 1  # and the loop goes on, fresh
        finally:
            local.fresh = outer
        raise Unavailable(
            f"not written: {CONFLICT_RETRIES} concurrent writers won the race for the same conversation; retry",
            reason="write_conflict",
            retry_after_ms=100,
        )

    return run  # type: ignore[return-value]


class CommandUnit(Application[UUID]):
    """The machinery of the commands (see the module doc); a subclass writes the commands,
    each `@retried`, its body in `with self._unit() as touched:`."""

    # One writer per event store (the data-dir lock), so a cached aggregate is never
    # behind the store: no deep copy, and no fast-forward query per command.
    env = {
        "AGGREGATE_CACHE_MAXSIZE": "10000",
        "DEEPCOPY_FROM_AGGREGATE_CACHE": "n",
        "AGGREGATE_CACHE_FASTFORWARD": "n",
    }

    def __init__(self, env: dict[str, str] | None = None, *, shared_store: bool = False) -> None:
        self.shared_store = shared_store
        if shared_store:  # other writers append to the same streams: never trust the cache blindly
            env = {**(env or {}), "AGGREGATE_CACHE_FASTFORWARD": "y"}
        super().__init__(env)
        self.conflicts = 0  # saves that lost a race and were retried
        self.lock = threading.RLock()
        self.saved_listeners: list[Callable[[], None]] = []
        # called in the writer's lock after each save with (position, mailbox entries) per event
        self.recorded_listeners: list[Callable[[list[tuple[int, int]]], None]] = []
        self._loaded: list[Aggregate] = []
        self._unit_now: Unit | None = None
        self._group: Group | None = None  # the commands being grouped (on its owner thread)
        self.group_commits = 0  # transactions of grouped commands
        self.grouped_commands = 0  # commands written in them
        self.group_fallbacks = 0  # groups whose one transaction failed: their commands ran again alone
        self._local = threading.local()  # .fresh: this thread's command re-decides on fresh aggregates
        self.stale_decisions = 0  # commands decided again because an unchecked aggregate was not saved

    # -- what a subclass adds ------------------------------------------------------------------

    def _saved(self, unit: Unit) -> None:
        """A command's unit is written (alone, or with its group): what it carried beside
        its aggregates is done (the application's activity refreshes)."""

    def _lost_race(self, aggregates: Sequence[object]) -> None:
        """A save of these aggregates lost an optimistic-concurrency race (they are about to
        be evicted and the command run again)."""

    # -- the library's save, for the command thread's CPU (ADR-0036) ---------------------------

    def save(self, *objs: Any, **kwargs: Any) -> list[Recording[UUID]]:
        """Application.save, its events collected by `Staged` (no Protocol isinstance checks)."""
        processing_event = Staged()
        processing_event.collect_events(*objs, **kwargs)
        recordings = self._record(processing_event)
        self._take_snapshots(processing_event)
        self._notify(recordings)
        self.notify(processing_event.events)  # the library's deprecated hook, called as it does
        return recordings

    def _record(self, processing_event: ProcessingEvent[UUID]) -> list[Recording[UUID]]:
        """The library's write of a save or a group's transaction, between two named steps
        where the crash tests kill a sender (projections/failpoints.py, labelled with the
        events' kinds): `command.recording` before it, `command.recorded` after it, before
        any caller hears of it."""
        events = processing_event.events
        failpoints.hit("command.recording", (type(e).__name__ for e in events))
        recordings = super()._record(processing_event)
        failpoints.hit("command.recorded", (type(e).__name__ for e in events))
        return recordings

    def _take_snapshots(self, processing_event: ProcessingEvent[UUID]) -> None:
        """A snapshot of each aggregate whose saved events reached a multiple of its interval,
        taken from the aggregate just saved: it is the recorded state at its version (the save
        succeeded at that version). The library reads the aggregate back from the store and
        replays up to 2,000 events (a quota slot's interval) on the command thread instead;
        that way stays for a group a refused command may have changed (`Staged.tainted`)."""
        if not (self.snapshots and self.snapshotting_intervals):
            return
        if getattr(processing_event, "tainted", True):
            super()._take_snapshots(processing_event)
            return
        due: dict[UUID, Aggregate] = {}
        for event in processing_event.events:
            aggregate = processing_event.aggregates.get(event.originator_id)
            interval = self.snapshotting_intervals.get(type(aggregate)) if aggregate is not None else None
            if interval is not None and event.originator_version % interval == 0:
                due[event.originator_id] = aggregate  # type: ignore[assignment]
        snapshots = []
        for aggregate in due.values():
            snapshot_class = getattr(type(aggregate), "Snapshot", type(self).snapshot_class)
            assert snapshot_class is not None, f"{type(aggregate)} has no snapshot class"
            snapshots.append(snapshot_class.take(aggregate))
        if snapshots:
            self.snapshots.put(snapshots)

    # -- one command -----------------------------------------------------------------------------

    def _find(
        self,
        cls: type[A],
        aggregate_id: UUID,
        tenant: str,
        what: str,
        *,
        saves: bool = False,
        monotone: bool = False,
        **details: Any,
    ) -> A | None:
        """The caller's aggregate of this id, or None when there is none. An aggregate of
        another kind or of another tenant under this id is NotFound: never acted on
        (ADR-0008; the derivation makes this unreachable, the check makes it certain).

        `saves`: the command is about to save this aggregate. On a shared store a cached
        copy is then taken as it is, without the fast-forward query (ADR-0023): a stale
        copy's save is refused by the version key; what the command decides without
        saving it is decided again (`StaleDecision`, raised by `_unit`), unless it is
        `monotone`: a token bucket, whose stale copy holds at least the fresh one's tokens,
        so that a refusal made on it is right and an admission is checked by its save."""
        check_tenant(tenant)
        found: Aggregate | None = None
        unit = self._unit_now
        fresh = getattr(self._local, "fresh", False)
        group = self._grouping()
        if group is not None and not fresh and aggregate_id not in group.evicted:
            # staged by an earlier command of the group: newer than the store (ADR-0030)
            found = group.processing.aggregates.get(aggregate_id)  # type: ignore[assignment]
            if found is not None and self.shared_store and unit is not None and not monotone:
                unit.unchecked.append(found)
        if found is None and saves and self.shared_store and unit is not None and not fresh:
            cache = self.repository.cache
            if cache is not None:
                with suppress(KeyError):
                    cached: Any = cache.get(aggregate_id)
                    if isinstance(cached, Aggregate):
                        found = cached
                        if not monotone:
                            unit.unchecked.append(cached)
        if found is None:
            try:
                found = self.repository.get(aggregate_id, projector_func=project)
            except AggregateNotFoundError:
                return None
        if not isinstance(found, cls) or getattr(found, "tenant", None) != tenant:
            raise NotFound(f"{what} not found", **details)
        self._loaded.append(found)
        return found

    @contextmanager
    def _unit(self) -> Iterator[Unit]:
        """Collect aggregates to save atomically. On failure, evict from the cache every
        aggregate the command mutated, so the next command reloads it from the store."""
        touched = Unit()
        with self.lock:
            self._loaded = []
            self._unit_now = touched
            try:
                try:
                    yield touched
                except FanoutError as refused:  # decided on an unchecked copy: decide again, fresh
                    if touched.unchecked:
                        raise StaleDecision(refused) from refused
                    raise
                if any(not any(a is t for t in touched) for a in touched.unchecked):
                    raise StaleDecision(None)
                group = self._grouping()
                if group is not None:  # written with the group's other commands (ADR-0030)
                    group.stage(touched)
                    return
                if touched:
                    recordings = self.save(*touched)
                    if recordings:
                        touched.position = max(r.notification.id for r in recordings)
                self._saved(touched)
            except BaseException as exc:
                if isinstance(exc, RecordConflictError):
                    self._lost_race(touched)
                dropped = [a for a in [*touched, *self._loaded] if a in touched or getattr(a, "_pending_events", None)]
                group = self._grouping()
                if group is not None and any(a.id in group.processing.aggregates for a in dropped):
                    # This command changed an aggregate earlier commands of the group staged, and
                    # failed: write theirs now, so that the next commands load them as written.
                    group.processing.tainted = True
                    try:
                        self._commit(group)
                    except BaseException as failed:
                        self._abandon(group, failed)
                        raise GroupBroken() from failed
                    group.reset()
                for a in dropped:
                    self._evict(a.id)
                unavailable = None if isinstance(exc, FanoutError | StaleDecision) else storage_unavailable(exc)
                if unavailable is not None:  # a full disk: 503 UNAVAILABLE, nothing written
                    raise unavailable from exc
                raise
            finally:
                self._unit_now = None
        if touched:
            for listener in self.saved_listeners:
                listener()

    # -- group commit of queued commands (ADR-0030) ---------------------------------------

    def _grouping(self) -> Group | None:
        g = self._group
        return g if g is not None and g.owner == threading.get_ident() else None

    def grouped(self, calls: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """Run commands of this application (`partial(app.send_message, ...)`) in order, as if
        one after another, with their events written in ONE event-store transaction: each
        returns or raises as it would alone; a refused one writes nothing and the others go
        on. A refused command that had changed an aggregate staged by earlier ones has those
        written first (two transactions). If a transaction fails (another writer won a race
        on one of its aggregates, or the store refused it), nothing of it is written and its
        commands and every later one run again alone, in order. Returns (result, None) or
        (None, exception) per call."""
        if len(calls) < 2 or self._grouping() is not None:
            return [outcome(c) for c in calls]
        outcomes: list[Outcome] = []
        with self.lock:
            group = self._group = Group()
            written = 0  # calls[:written] are written (or wrote nothing)
            try:
                for c in calls:
                    done = outcome(c)
                    if isinstance(done[1], GroupBroken):
                        break
                    outcomes.append(done)
                    if not group.units:  # a piece was written within this call
                        written = len(outcomes)
                else:
                    try:
                        self._commit(group)
                    except BaseException as exc:
                        self._abandon(group, exc)
                    else:
                        return outcomes
            finally:
                self._group = None
        self.group_fallbacks += 1
        return outcomes[:written] + [outcome(c) for c in calls[written:]]  # alone, in order

    def _commit(self, group: Group) -> None:
        """The group's one transaction, then what each command's own save would have done."""
        pe = group.processing
        top: int | None = None
        if pe.events:
            recordings = self._record(pe)
            self.group_commits += 1
            self.grouped_commands += len(group.units)
            self._take_snapshots(pe)
            self._notify(recordings)
            at = {id(r.domain_event): r.notification.id for r in recordings}
            for unit, first, end in group.units:
                if end > first:
                    unit.position = max(at[id(e)] for e in pe.events[first:end])
            top = max(at.values())
        for unit, _, _ in group.units:
            self._saved(unit)
        for aggregate_id in group.evicted:  # the commit may have cached it as a refused command left it
            self._evict(aggregate_id)
        if group.answers:
            top = top if top is not None else self.log_position()
            for result, unit in group.answers:
                result["position"] = unit.position if unit.position is not None else top
        if pe.events:
            for listener in self.saved_listeners:
                listener()

    def _abandon(self, group: Group, exc: BaseException) -> None:
        """The group's transaction failed: drop every aggregate it touched from the cache."""
        if isinstance(exc, RecordConflictError):
            self._lost_race(list(group.processing.aggregates.values()))
        for aggregate_id in {*group.processing.aggregates, *group.evicted}:
            self._evict(aggregate_id)
        log.debug("a group of %d commands was not written (%s); running them alone", len(group.units), exc)

    # -- after a save -------------------------------------------------------------------------

    def _notify(self, recordings: list[Recording[UUID]]) -> None:
        """eventsourcing's hook after a save: report positions and each send's fan-out
        entries (backpressure counts the read side's backlog without a query, ADR-0010)."""
        if self.recorded_listeners:
            recorded = [(r.notification.id, int(getattr(r.domain_event, "fanout_entries", 0) or 0)) for r in recordings]
            for listener in self.recorded_listeners:
                listener(recorded)

    def log_position(self) -> int:
        """The notification id of the last event in the store (0 when empty)."""
        return self.recorder.max_notification_id() or 0

    def _positioned(self, result: dict[str, Any], unit: Unit) -> dict[str, Any]:
        """A command's answer with its log position (read-your-writes): the last event it
        recorded, or the current log position when it recorded nothing (in a group: once the
        group is written)."""
        group = self._grouping()
        if group is not None:
            group.answers.append((result, unit))
            return result
        result["position"] = unit.position if unit.position is not None else self.log_position()
        return result

    def _evict(self, aggregate_id: UUID) -> None:
        group = self._grouping()
        if group is not None:
            group.evicted.add(aggregate_id)
        cache = getattr(self.repository, "cache", None)
        if cache is not None:
            with suppress(KeyError):
                cache.get(aggregate_id, evict=True)
