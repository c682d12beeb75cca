"""The projection host: the one unit of work of every runtime (ADR-0029). The embedded
runner (`streams/embedded.py`), the Faust worker (`streams/worker.py`) and rebuild/verify on
both engines (`tools/rebuild.py`) hand it records of a log (`Record`: `EventRecord`s and
`Watermark`s, from a Kafka partition take or from the event store's notifications through
`streams/notification_log.py`) and it folds them through the projections of
`projections/hosting.py` into the views, committing each unit through the ViewStore's writer
in the order of ADR-0012/ADR-0025.

* **One unit of work per take.** A take spans many conversations and log partitions: ONE
  unit of work over all of them, cut short only by ALONE or the mailbox-entry bound.
* **Idempotence by tracking.** The tracked position of (projection, partition) decides: an
  event record at or below it is skipped (redelivery, a rebalance, a restarted process); a
  watermark R tracks max(current, R) for its partition; projections also skip by their own
  applied positions (ADR-0012).
* **A failed unit** (or take) drops the working sets of its partitions whose records did not
  all commit (reloaded from the views) and raises; the caller retries the same records.
* **Fencing and healing (ADR-0021).** Before a unit writes and during a long commit the host
  checks that the views still stand where its last commit left them: past it, another writer
  took the partition (`Fenced`); below it, the views lost acknowledged writes and the log is
  read again from where they stand (`LogReader`). The read of a take's check is in flight
  while the unit folds (ADR-0047); it is answered before the unit's first write.
* **Effects after the commit**: `on_effects(effects)` gets the projections' effects and a
  `ViewsTracked` per unit; its exceptions are logged, never fatal.

Everything here is synchronous and runs on one thread per host (a worker's executor, the
embedded projector's thread, the rebuild's caller).

Why this module is long: the one unit of work of every runtime (take, fold, commit, effects)
with its fencing and healing: they share the working sets and the tracked positions, and
splitting them would put the crash-safety order of ADR-0012 in two places."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from domain.conversation import Conversation
from domain.params import Parameters
from domain.review import topics_of
from projections import failpoints
from projections.capacity import ReviewTrigger
from projections.capacity_monitor import CapacityMonitor
from projections.delivery import DeliveryProjection
from projections.hosting import Effect, Projection, ViewsTracked, build_projections, folded_topics, topics
from projections.ports import ALL_TARGETS, LogPosition, ViewStore
from streams.records import EventRecord, Watermark

log = logging.getLogger("fanout.host")

Record = EventRecord | Watermark
FENCE_RECHECK = 1.0  # seconds a commit runs before it checks again that no one wrote past it


class Fenced(RuntimeError):
    """Another writer has written this partition's views past where this host stood: the
    unit is stopped (what it wrote is older than what is there, and loses: ADR-0021)."""


class _Moved(Exception):
    """A fence read answered during a unit: the views do not stand where this host's last
    commit of the partition left them (raised before the unit writes anything)."""

    def __init__(self, partition: int, stored: LogPosition | None) -> None:
        super().__init__(partition)
        self.partition, self.stored = partition, stored


class _Behind(Exception):
    """A partition was dropped because its views stand below this host's last commit: the
    take reloads it (healing from the log) and goes on."""


class LogReader(Protocol):
    """Reads [start, end) of one log partition again (streams/log_reader.py)."""

    def read(self, partition: int, start: int, end: int) -> list[EventRecord | Watermark]: ...


@dataclass
class HostStats:
    records: int = 0  # records handed to apply()
    applied: int = 0  # event records processed by at least one projection
    skipped: int = 0  # event records at or below the tracked positions (redelivered)
    units: int = 0  # committed units of work
    entries: int = 0  # mailbox entries written
    effects: int = 0
    failures: int = 0  # failed units of work
    fenced: int = 0  # units stopped: another writer had written the partition past them (ADR-0021)
    heals: int = 0  # times the views were found behind what this host had committed (lost writes)
    reread: int = 0  # records read again from the log to fill a gap (heals, resumes)
    started: float = field(default_factory=time.monotonic)


# Events that reshape a conversation's member states (who is a member, who is active, who
# is skipped): each is the only event of ITS conversation in a unit of work (other
# conversations' events may share the unit). Cassandra writes a conversation's rows and its
# head in one batch, one mutation, but the states of a large reshaping (a 100k-member join)
# go ahead of it in chunks, so after a crash between the two a replay reloads the states as
# the unit left them: a send replayed with a later join's states would reach the joiner.
# With a reshaping event alone among its conversation's events, the sends replayed with any
# reloaded states are only those of units where the member set did not change (ADR-0014,
# ADR-0025). A store whose units are one transaction (`ViewStore.atomic_units`: SQLite, memory)
# never leaves states without their head, and its units are not cut (ADR-0029).
ALONE = frozenset(
    topics_of(
        Conversation.Created,
        Conversation.MembersJoined,
        Conversation.MemberLeft,
        Conversation.WritePolicyChanged,
        Conversation.RebuildRequested,
        Conversation.MembersActive,  # who is active decides who a mention_only send reaches
    )
)


@dataclass
class _Fold:
    """What one partition's records contributed to a unit of work."""

    count: int  # records consumed (applied, skipped or tracked only)
    applied: int
    skipped: int
    last: dict[str, int]  # projection -> the position the unit tracks for this partition
    next_offset: int  # the next Kafka offset of the partition to read (-1: unknown)


class ProjectionHost:
    """The projections of the log partitions a process holds (the embedded runtime's log is
    one partition, 0), and their units of work. Every method runs on one thread."""

    def __init__(
        self,
        views: ViewStore,
        params: Parameters,
        to_domain_event: Callable[[EventRecord], Any],
        on_effects: Callable[[Sequence[Effect]], None] | None = None,
        *,
        max_entries_per_commit: int = 200_000,
        triggers: bool = True,
        log_reader: LogReader | None = None,
        targets: frozenset[str] = ALL_TARGETS,
    ) -> None:
        """`targets`: the targets of the views a unit writes (a rebuild of some of them).
        `triggers=False`: each partition's capacity window only counts; T1/T2 are
        evaluated over the merged windows by `evaluate_capacity` (ADR-0020). `log_reader`:
        reads a partition range again when the views stand behind the records handed in
        (lost writes, a resume past them); without it such a gap is only logged."""
        self.views = views
        self.params = params
        self.triggers = triggers
        self.to_domain_event = to_domain_event
        self.on_effects = on_effects
        self.max_entries_per_commit = max_entries_per_commit
        self.targets = targets
        self.stats = HostStats()
        self._sets: dict[int, tuple[Projection, ...]] = {}
        self._routes: dict[int, dict[type, tuple[Projection, ...]]] = {}
        self._tracked: dict[int, dict[str, int]] = {}
        self._topics: frozenset[str] | None = None  # the stored topics some projection folds
        self.log_reader = log_reader
        # partition -> the position this host's last commit left in the views (None: unknown)
        self._committed: dict[int, int | None] = {}
        # partition -> a position this host knows it committed, kept across a failed unit: the
        # views found below it on reload have lost acknowledged writes (a Cassandra crash)
        self._floor: dict[int, int] = {}

    # -- working sets and tracked positions -------------------------------------------------

    def projections(self, partition: int) -> tuple[Projection, ...]:
        ps = self._sets.get(partition)
        if ps is None:
            ps = self._sets[partition] = build_projections(
                self.views, self.params, partition=partition, triggers=self.triggers
            )
            self._routes[partition] = {t: tuple(p for p in ps if t in p.topics) for t in topics(ps)}
            if self._topics is None:
                self._topics = folded_topics(ps)
        return ps

    def tracked(self, partition: int) -> dict[str, int]:
        """projection -> the position its views hold for this partition (read once, then
        kept up to date by this host's commits)."""
        t = self._tracked.get(partition)
        if t is None:
            t = self._tracked[partition] = {
                p.name: self.views.position(p.name, partition) for p in self.projections(partition)
            }
        return t

    def forget(self, partitions: Iterable[int] | None = None, *, failed: bool = False) -> None:
        """Drop the working sets and tracked positions of these partitions (all when None):
        a revoked partition, or (`failed`) a failed unit of work, after which the position
        this host had committed is kept to check the views against. Reloaded when needed."""
        for partition in list(self._sets if partitions is None else partitions):
            for p in self._sets.pop(partition, ()):
                p.forget()
            self._routes.pop(partition, None)
            self._tracked.pop(partition, None)
            committed = self._committed.pop(partition, None)
            if not failed:
                self._floor.pop(partition, None)
            elif committed is not None:
                self._floor[partition] = max(self._floor.get(partition, 0), committed)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._sets)

    # -- applying ---------------------------------------------------------------------------

    def apply(self, partition: int, records: Sequence[Record]) -> int:
        """Apply one partition's records: `apply_take({partition: records})`."""
        return self.apply_take({partition: records})

    def apply_take(self, by_partition: Mapping[int, Sequence[Record]]) -> int:
        """Apply a take: each partition's records in partition order, every partition in the
        same units of work (one, unless ALONE or the mailbox-entry bound cuts one short: then
        as many as they need); returns how many records went into committed units. Raises
        when a unit fails (the working sets of its partitions are dropped; retry the same
        records)."""
        pending: dict[int, Sequence[Record]] = {}
        checks: dict[int, Callable[[], LogPosition | None]] = {}  # partition -> its fence read, in flight
        finished: set[int] = set()
        try:
            for partition in by_partition:
                self.stats.records += len(by_partition[partition])
            self._resume_all(by_partition, pending, checks)
            done = 0
            while pending:
                try:
                    counts = self._unit(pending, checks)
                except _Behind:  # a fence read found the views below this host's commit: reload
                    self._resume_all(dict(pending), pending, checks)
                    continue
                for partition, n in counts.items():
                    done += n
                    rest = pending[partition][n:]
                    if rest:
                        pending[partition] = rest
                    else:
                        del pending[partition]
                        finished.add(partition)
        except BaseException:
            # The records _resume read again live in `pending` only: every partition whose
            # records did not all commit is reloaded on the retry, which finds the same hole
            # (a Cassandra restart's first requests meet dead connections, mid-take).
            self.forget([p for p in by_partition if p not in finished], failed=True)
            raise
        return done

    def _resume_all(
        self,
        by_partition: Mapping[int, Sequence[Record]],
        pending: dict[int, Sequence[Record]],
        checks: dict[int, Callable[[], LogPosition | None]],
    ) -> None:
        for partition in sorted(by_partition):
            heals = self.stats.heals
            pending[partition] = self._resume(partition, by_partition[partition], checks)
            healed = self.stats.heals > heals
            failpoints.hit("take.resumed", ("healed", f"healed-p{partition}") if healed else ())

    def _resume(
        self, partition: int, records: Sequence[Record], checks: dict[int, Callable[[], LogPosition | None]]
    ) -> Sequence[Record]:
        """A partition this host holds: its fence read is started (`checks`), answered before
        the partition's next unit writes (`_verify`), so it is in flight while the unit folds.
        Else the partition is (re)loaded, and the records the views have not applied are put in
        front of `records`."""
        checks.pop(partition, None)
        if partition in self._tracked:
            if self._committed.get(partition) is not None:
                checks[partition] = self.views.log_position_later(partition)
            return records
        return self._load(partition, records, self.views.log_position(partition))

    def _stands(self, partition: int, stored: LogPosition | None) -> bool:
        """The views stand where this host's last commit of the partition left them (or it
        has none to compare with)."""
        committed = self._committed.get(partition)
        return committed is None or (stored is not None and stored.position == committed)

    def _verify(self, partition: int, stored: LogPosition | None) -> bool:
        """Check the views still stand where this host's last commit of the partition left
        them (ADR-0021). Past it: another writer took the partition, Fenced (its working set
        is reloaded on the retry). Below it (or no row where this host committed one): the
        views lost acknowledged writes; the partition is dropped, True: reload it (`_load`
        heals from the log)."""
        if self._stands(partition, stored):
            return False
        committed = self._committed.get(partition) or 0  # not None: _stands
        if stored is not None and stored.position > committed:
            self.stats.fenced += 1
            self.forget([partition])  # reload what the other writer left
            raise Fenced(
                f"partition {partition}: the views were written up to position {stored.position} by "
                f"another worker while this one stood at {committed}; its working set is reloaded"
            )
        self.forget([partition], failed=True)  # below what we committed: lost writes
        return True

    def _load(self, partition: int, records: Sequence[Record], stored: LogPosition | None) -> Sequence[Record]:
        tracked = self.tracked(partition)
        self._committed[partition] = stored.position if stored is not None else None
        floor = self._floor.get(partition)  # kept until a commit of the partition reaches it
        lost = floor is not None and (stored is None or stored.position < floor)
        if not lost:
            self._floor.pop(partition, None)
        else:
            self.stats.heals += 1
            log.warning(
                "partition %d: the views stand at position %s, below the %d this worker had committed: "
                "they lost acknowledged writes (a Cassandra crash?); the log is read again from there",
                partition,
                stored.position if stored is not None else 0,
                floor,
            )
        if stored is not None and stored.next_offset >= 0:
            start: int | None = stored.next_offset
        elif lost or max(tracked.values(), default=0) == 0:
            start = 0  # nothing of this partition in the views: the whole partition precedes
        else:
            start = None  # views written before log positions were kept: nothing to go by
        first = records[0].offset if records else -1
        if start is None or first <= start:
            return records
        if self.log_reader is None:
            if lost:
                log.error("partition %d: no log reader to re-read offsets %d..%d", partition, start, first - 1)
            return records
        missing = self.log_reader.read(partition, start, first)
        if missing:
            self.stats.reread += len(missing)
            log.info(
                "partition %d: read %d records again (offsets %d..%d) the views had not applied",
                partition,
                len(missing),
                start,
                first - 1,
            )
        return [*missing, *records]

    def _checkpoint(self, committed: Mapping[int, int | None], labels: set[str]) -> Callable[[str], None]:
        """Called by the store between the steps of its commit: fault-injection points, and
        after FENCE_RECHECK seconds (a long unit, a paused process) a check that no other
        writer has written a partition of the unit past where this unit started (Fenced if so)."""
        checked = [time.monotonic()]

        def check(step: str) -> None:
            failpoints.hit(f"commit.{step}", labels)
            now = time.monotonic()
            if now - checked[0] < FENCE_RECHECK:
                return
            checked[0] = now
            for partition, position in committed.items():
                stored = self.views.log_position(partition) if position is not None else None
                if stored is not None and position is not None and stored.position > position:
                    raise Fenced(
                        f"partition {partition}: another worker wrote its views up to position {stored.position} "
                        f"while this one's unit (from {position}) was being committed: the unit is stopped"
                    )

        return check

    def _unit(
        self, pending: Mapping[int, Sequence[Record]], checks: dict[int, Callable[[], LogPosition | None]]
    ) -> dict[int, int]:
        """One unit of work over the partitions of `pending`: partition -> how many of its
        records went into it. The fence reads of `checks` are answered before anything is
        written (raises _Behind when a partition was dropped for a reload)."""
        counts: dict[int, int] = {}
        work: dict[int, Sequence[Record]] = {}
        lows: dict[int, int] = {}  # partition -> the lowest position its views tracked
        for partition, records in pending.items():
            low = lows[partition] = min(self.tracked(partition).values())
            if all(r.position <= low for r in records):  # all redelivered: nothing to write
                self.stats.skipped += sum(isinstance(r, EventRecord) for r in records)
                counts[partition] = len(records)
            else:
                work[partition] = records
        for partition in [p for p in checks if p in pending and p not in work]:
            if self._verify(partition, checks.pop(partition)()):
                raise _Behind(partition)
        if not work:
            return counts
        effects: list[Effect] = []
        labels: set[str] = set()  # the kinds of events in the unit (failpoints)
        folds: dict[int, _Fold] = {}
        delivery = DeliveryProjection.name
        since = {p: self.tracked(p)[delivery] for p in work if delivery in self.tracked(p)}
        try:
            checkpoint = self._checkpoint({p: self._committed.get(p) for p in work}, labels)
            with self.views.unit_of_work(self.targets, checkpoint=checkpoint) as w:
                for partition, records in work.items():
                    w.applying(partition, lows[partition])
                    folds[partition] = self._fold(partition, records, w, effects, labels)
                    if w.mailbox_entries >= self.max_entries_per_commit:
                        break
                for partition, fold in folds.items():
                    w.applying(partition, lows[partition])
                    for p in self.projections(partition):
                        p.flush(w)
                        w.track(p.name, fold.last[p.name], partition)
                    w.track_log(partition, max(fold.last.values()), fold.next_offset)
                for partition in [p for p in folds if p in checks]:  # read while folding; nothing written yet
                    stored = checks.pop(partition)()
                    if not self._stands(partition, stored):
                        raise _Moved(partition, stored)
                entries = w.mailbox_entries
                heads = tuple(w.heads_written())
        except _Moved as moved:
            # Nothing written; every working set of the unit ran ahead: reload them
            self.forget([p for p in work if p != moved.partition], failed=True)
            self._verify(moved.partition, moved.stored)  # raises Fenced, or drops it: lost writes
            raise _Behind(moved.partition) from None
        except BaseException as exc:
            # The working sets ran ahead of what committed: reload them from the views.
            if isinstance(exc, Fenced):
                self.stats.fenced += 1
            else:
                self.stats.failures += 1
            self.forget(list(work), failed=True)
            raise
        s = self.stats
        for partition, fold in folds.items():
            self.tracked(partition).update(fold.last)
            committed = self._committed[partition] = max(fold.last.values())
            if committed >= self._floor.get(partition, committed):
                self._floor.pop(partition, None)  # healed: the views hold what this host had committed
            counts[partition] = fold.count
            s.applied += fold.applied
            s.skipped += fold.skipped
        s.units += 1
        s.entries += entries
        s.effects += len(effects)
        positions = {p: f.last[delivery] for p, f in folds.items() if delivery in f.last}
        effects.append(ViewsTracked(positions, {p: since[p] for p in positions if p in since}, heads))
        if self.on_effects is not None:
            try:
                self.on_effects(effects)
            except Exception:
                log.exception("acting on the effects failed (the views are committed)")
        return counts

    def _fold(
        self, partition: int, records: Sequence[Record], w: Any, effects: list[Effect], labels: set[str]
    ) -> _Fold:
        """Fold a prefix of one partition's records through its projections into the unit's
        writer: up to an event ALONE keeps out of this unit, or the mailbox-entry bound."""
        routes = self._routes[partition]
        tracked = self.tracked(partition)
        low = min(tracked.values())
        wanted = self._topics or frozenset()
        count = applied = skipped = 0
        top = 0
        alone = frozenset() if getattr(self.views, "atomic_units", False) else ALONE
        touched: set[Any] = set()  # the conversations (aggregates) with an event in this unit
        reshaped: set[Any] = set()  # those whose event in this unit reshapes their member states
        for r in records:
            count += 1
            top = max(top, r.position)
            if isinstance(r, Watermark):
                continue
            if r.position <= low:
                skipped += 1
                continue
            if r.topic not in wanted:
                continue  # an event no projection folds (a quota charge): tracked only
            aggregate = r.originator_id
            if aggregate in reshaped or (r.topic in alone and aggregate in touched):
                count -= 1  # end the unit before it: see ALONE
                top = max((x.position for x in records[:count]), default=0)
                break
            touched.add(aggregate)
            if r.topic in alone:
                reshaped.add(aggregate)
            event = self.to_domain_event(r)
            labels.add(type(event).__name__)
            for p in routes.get(type(event), ()):
                if r.position > tracked[p.name]:
                    effects.extend(p.process(event, r.position, w))
            applied += 1
            if w.mailbox_entries >= self.max_entries_per_commit:
                break
        offsets = [r.offset for r in records[:count] if r.offset >= 0]
        return _Fold(
            count=count,
            applied=applied,
            skipped=skipped,
            last={p.name: max(tracked[p.name], top) for p in self.projections(partition)},
            next_offset=max(offsets) + 1 if offsets else -1,
        )

    def evaluate_capacity(self, monitor: CapacityMonitor) -> list[ReviewTrigger]:
        """T1/T2 over every partition's committed window; the triggers go to on_effects
        (which opens their reviews) like a unit of work's effects."""
        triggers = monitor.evaluate()
        if triggers and self.on_effects is not None:
            try:
                self.on_effects(triggers)
            except Exception:
                log.exception("acting on the capacity triggers failed")
        return triggers
