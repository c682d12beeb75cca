"""The projection worker (`fanout worker`): a Faust app whose one agent hosts the same
projections as the embedded runner (`projections/hosting.py` `build_projections`) over a
ViewStore, reading the event topic the relay writes (`streams/records.py`).

* **One unit of work per take.** The agent takes up to `batch` events within `within` seconds
  (`stream.take_events`), groups them by Kafka partition and runs ONE unit of work over all
  of them (cut short only by ALONE or the mailbox-entry bound), committed in a few rounds
  (ADR-0025), in a single-thread executor (`loop.run_in_executor`): the Faust event loop
  never waits on a view store, and the units of one worker never overlap (the view stores
  are not required to take concurrent units from one process). Each partition keeps its own
  projections, tracking and log position inside the unit.
* **One projection set per partition** (`build_projections(views, params, partition=p)`:
  the capacity window is saved per partition), built lazily from the committed views.
* **Idempotence by tracking, not by Kafka offsets.** The tracked position of (projection,
  partition) decides: an event record at or below it is skipped (at-least-once delivery, a
  rebalance, a restarted worker, a reset consumer group); projections also skip by their
  own applied positions (ADR-0012). A watermark record R tracks max(current, R) for that
  partition. Faust commits offsets on its own, only for events the agent has finished (the
  take buffer acks after the batch is handled), so a committed offset is never ahead of the
  views; behind them is harmless.
* **A failed unit** drops that partition's working sets (rebuilt from the views), is logged
  once (then once per interval while it keeps failing) and the same records are retried
  after a short backoff: nothing is acked or skipped.
* **Revocation** forgets the revoked partitions' working sets and tracked positions (another
  worker may advance them); they are reloaded if the partition comes back.
* **read_committed.** The relay writes in Kafka transactions; a record of an aborted one is
  never applied. faust-streaming 0.15.3 has no setting for the consumer's isolation level
  (it reads committed only with processing_guarantee="exactly_once", which also makes Faust
  run transactional producers we do not need), so the app's consumer thread sets it on the
  aiokafka consumer it creates (`ReadCommittedConsumerThread`).
* **Effects after the commit**: `on_effects(effects)` (the caller publishes the pushes,
  `streams/pushes.py`, and opens reviews); its exceptions are logged, never fatal.
* **T1/T2 over the platform**: each partition's capacity window only counts; the worker
  holding partition 0 evaluates T1/T2 once a second over every partition's committed window
  (`projections.capacity_monitor`, ADR-0020) and opens the reviews through `on_effects`.
* **Heartbeats**: `beat(WorkerBeat)` once a second from a Faust timer, i.e. from the event
  loop (a stuck loop stops beating), with the partitions held; a last one, `leaving`, when
  the worker stops. The caller publishes them on the pushes topic, where the API replicas
  count the live workers (ADR-0019)."""

from __future__ import annotations

import asyncio
import logging
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from domain.conversation import Conversation
from domain.params import Parameters
from domain.review import topics_of
from projections import failpoints
from projections.capacity import ReviewTrigger
from projections.capacity_monitor import CapacityMonitor
from projections.delivery import DeliveryProjection
from projections.failures import Throttled, storage_failure
from projections.hosting import Effect, Projection, ViewsTracked, build_projections, topics
from projections.ports import LogPosition, ViewStore
from streams.log_reader import KafkaPartitionReader, LogGapUnreadable
from streams.pushes import BEAT_INTERVAL, WorkerBeat, ensure_topic, partition_count, worker_id
from streams.records import BadRecord, EventRecord, Watermark, decode

log = logging.getLogger("fanout.worker")

Record = EventRecord | Watermark
RETRY_AFTER_FAILURE = 0.5  # seconds between attempts at a failing unit of work
FENCE_RECHECK = 1.0  # seconds a commit runs before it checks again that no one wrote past it


class Fenced(RuntimeError):
    """Another writer has written this partition's views past where this host stood: the
    unit is stopped (what it wrote is older than what is there, and loses: ADR-0021)."""


class LogReader(Protocol):
    """Reads [start, end) of one log partition again (streams/log_reader.py)."""

    def read(self, partition: int, start: int, end: int) -> list[EventRecord | Watermark]: ...


CAPACITY_INTERVAL = 1.0  # seconds between evaluations of T1/T2 over the merged windows


# -- the units of work (no Faust here: synchronous, run on the executor's thread) ----------------


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
# ADR-0025).
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


class PartitionHost:
    """The projections of the partitions a worker holds, and their units of work. Every
    method runs on one thread (the worker's executor)."""

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
    ) -> None:
        """`triggers=False`: each partition's capacity window only counts; T1/T2 are
        evaluated over the merged windows by `evaluate_capacity` (ADR-0020). `log_reader`:
        reads a partition range again when the views stand behind the records handed in
        (lost writes, a resume past them); without it such a gap is only logged."""
        self.views = views
        self.params = params
        self.triggers = triggers
        self.to_domain_event = to_domain_event
        self.on_effects = on_effects
        self.max_entries_per_commit = max_entries_per_commit
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
                self._topics = frozenset(topics_of(*topics(ps)))
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
        for partition in sorted(by_partition):
            self.stats.records += len(by_partition[partition])
            pending[partition] = self._resume(partition, by_partition[partition])
        done = 0
        while pending:
            for partition, n in self._unit(pending).items():
                done += n
                rest = pending[partition][n:]
                if rest:
                    pending[partition] = rest
                else:
                    del pending[partition]
        return done

    def _resume(self, partition: int, records: Sequence[Record]) -> Sequence[Record]:
        """Check the views still stand where this host left them, (re)load the partition
        if needed, and put in front of `records` those the views have not applied."""
        stored: LogPosition | None = None
        if partition in self._tracked:
            stored = self.views.log_position(partition)
            committed = self._committed.get(partition)
            if stored is not None and committed is not None and stored.position != committed:
                if stored.position > committed:
                    self.stats.fenced += 1
                    self.forget([partition])  # reload what the other writer left
                    raise Fenced(
                        f"partition {partition}: the views were written up to position {stored.position} by "
                        f"another worker while this one stood at {committed}; its working set is reloaded"
                    )
                self.forget([partition], failed=True)  # below what we committed: lost writes
        if partition not in self._tracked:  # (re)load; the row just read is still where the views stand
            records = self._load(partition, records, stored or self.views.log_position(partition))
        return records

    def _load(self, partition: int, records: Sequence[Record], stored: LogPosition | None) -> Sequence[Record]:
        tracked = self.tracked(partition)
        self._committed[partition] = stored.position if stored is not None else None
        floor = self._floor.pop(partition, None)
        lost = floor is not None and (stored is None or stored.position < floor)
        if lost:
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

    def _unit(self, pending: Mapping[int, Sequence[Record]]) -> dict[int, int]:
        """One unit of work over the partitions of `pending`: partition -> how many of its
        records went into it."""
        counts: dict[int, int] = {}
        work: dict[int, Sequence[Record]] = {}
        for partition, records in pending.items():
            low = min(self.tracked(partition).values())
            if all(r.position <= low for r in records):  # all redelivered: nothing to write
                self.stats.skipped += sum(isinstance(r, EventRecord) for r in records)
                counts[partition] = len(records)
            else:
                work[partition] = records
        if not work:
            return counts
        effects: list[Effect] = []
        labels: set[str] = set()  # the kinds of events in the unit (failpoints)
        folds: dict[int, _Fold] = {}
        try:
            with self.views.unit_of_work() as w:
                w.checkpoint = self._checkpoint({p: self._committed.get(p) for p in work}, labels)
                for partition, records in work.items():
                    w.partition = partition
                    folds[partition] = self._fold(partition, records, w, effects, labels)
                    if w.mailbox_entries >= self.max_entries_per_commit:
                        break
                for partition, fold in folds.items():
                    w.partition = partition
                    for p in self.projections(partition):
                        p.flush(w)
                        w.track(p.name, fold.last[p.name], partition)
                    w.track_log(partition, max(fold.last.values()), fold.next_offset)
                entries = w.mailbox_entries
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
            self._committed[partition] = max(fold.last.values())
            counts[partition] = fold.count
            s.applied += fold.applied
            s.skipped += fold.skipped
        s.units += 1
        s.entries += entries
        s.effects += len(effects)
        delivery = DeliveryProjection.name
        effects.append(ViewsTracked({p: f.last[delivery] for p, f in folds.items() if delivery in f.last}))
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
            if aggregate in reshaped or (r.topic in ALONE and aggregate in touched):
                count -= 1  # end the unit before it: see ALONE
                top = max((x.position for x in records[:count]), default=0)
                break
            touched.add(aggregate)
            if r.topic in ALONE:
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


# -- records from Kafka -------------------------------------------------------------------


def group_by_partition(
    messages: Iterable[tuple[int, Any, bytes | None] | tuple[int, Any, bytes | None, int]],
) -> dict[int, list[Record]]:
    """(partition, headers, value[, offset]) in arrival order -> partition -> its records in
    order. A record neither the relay nor a test wrote is logged and left out (it can never apply)."""
    out: dict[int, list[Record]] = {}
    for message in messages:
        partition, headers, value = message[:3]
        offset = message[3] if len(message) > 3 else -1
        if isinstance(headers, Mapping):
            headers = list(headers.items())
        try:
            rec = decode(headers, value, offset)
        except BadRecord as exc:
            log.error("skipped a record of partition %d: %s", partition, exc)
            continue
        out.setdefault(partition, []).append(rec)
    return out


ENGINE_DRIVERS = ("cassandra", "confluent_kafka", "psycopg", "aiokafka")


def engine_unavailable(exc: BaseException) -> bool:
    """An engine away or overloaded (its driver's exception, or a socket error), as opposed to
    a bug: the worker logs the first kind in one line."""
    return isinstance(exc, OSError | TimeoutError) or type(exc).__module__.split(".")[0] in ENGINE_DRIVERS


class Applier:
    """The asyncio side: hands each partition's records to the host on the executor and
    retries a failed unit after a backoff until it commits."""

    def __init__(self, host: PartitionHost, *, backoff: float = RETRY_AFTER_FAILURE) -> None:
        self.host = host
        self.backoff = backoff
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fanout-worker-unit")
        self._throttled = Throttled(log)
        self.last_error: str | None = None

    async def apply(self, by_partition: Mapping[int, Sequence[Record]]) -> None:
        """The take's records of every partition, in one unit of work where the rules allow
        (PartitionHost.apply_take), retried after a failure until they commit."""
        loop = asyncio.get_running_loop()
        parts = ",".join(map(str, sorted(by_partition)))
        failures = 0
        while True:
            try:
                await loop.run_in_executor(self.executor, self.host.apply_take, by_partition)
                break
            except (Fenced, LogGapUnreadable) as exc:
                # one line, no traceback: the retry reloads the partition from the views
                log.warning("%s", exc)
                self.last_error = str(exc)
                await asyncio.sleep(self.backoff)
            except Exception as exc:
                failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                reason = storage_failure(exc) or "projector_failed"
                if failures == 1 and engine_unavailable(exc):  # one line: it says what is away
                    log.error("unit of work of partitions %s failed: %s; retrying it", parts, self.last_error)
                elif failures == 1:  # anything else may be a bug: its stack
                    log.exception("unit of work of partitions %s failed (%s); retrying it", parts, reason)
                else:
                    self._throttled("failing", logging.ERROR, "partitions %s still failing: %s", parts, self.last_error)
                await asyncio.sleep(self.backoff)
        if failures:
            log.warning("partitions %s recovered after %d failed attempts", parts, failures)
            self.last_error = None

    async def forget(self, partitions: Iterable[int]) -> None:
        await asyncio.get_running_loop().run_in_executor(self.executor, self.host.forget, list(partitions))

    async def evaluate_capacity(self, monitor: CapacityMonitor) -> None:
        """On the executor, between units of work; a failure is logged (throttled) and the
        next evaluation tries again."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.host.evaluate_capacity, monitor)
        except Exception as exc:
            self._throttled("capacity", logging.ERROR, "evaluating T1/T2 failed: %s: %s", type(exc).__name__, exc)

    def close(self) -> None:
        self.executor.shutdown(wait=True)


# -- Faust ------------------------------------------------------------------------------


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """aiokafka's consumer as Faust builds it, reading committed records only."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # handed to aiokafka's Fetcher at start()
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer


class WorkerApp(faust.App):
    """A Faust app whose consumer reads committed records only (see the module doc)."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class WorkerSettings:
    bootstrap: str  # host:port[,host:port]
    topic: str  # the event topic
    partitions: int = 6  # of the event topic, when this worker creates it
    replication: int = 1
    min_insync: int = 0  # min.insync.replicas of the event topic, when this worker creates it
    app_id: str | None = None  # the consumer group; default fanout-worker.<topic>
    web_port: int = 0  # Faust's web server on 127.0.0.1; 0: a free port
    datadir: Path | None = None  # Faust's data dir (nothing durable is kept there); default a temp dir
    batch: int = 500  # events per take
    within: float = 0.05  # seconds a take waits for more
    session_timeout: float = 10.0  # a dead worker's partitions move after this
    heartbeat: float = 1.0
    max_entries_per_commit: int = 200_000

    @property
    def group(self) -> str:
        return self.app_id or f"fanout-worker.{self.topic}"


class ProjectionWorker:
    """The Faust app with its agent, the host of the projections and the executor."""

    def __init__(
        self,
        settings: WorkerSettings,
        views: ViewStore,
        params: Parameters,
        to_domain_event: Callable[[EventRecord], Any],
        on_effects: Callable[[Sequence[Effect]], None] | None = None,
        beat: Callable[[WorkerBeat], None] | None = None,
    ) -> None:
        self.settings = s = settings
        self.worker_id = worker_id()
        self._beat = beat
        self.log_reader = KafkaPartitionReader(s.bootstrap, s.topic)
        self.host = PartitionHost(
            views,
            params,
            to_domain_event,
            on_effects,
            max_entries_per_commit=s.max_entries_per_commit,
            triggers=False,
            log_reader=self.log_reader,
        )
        self.applier = Applier(self.host)
        ensure_topic(s.bootstrap, s.topic, s.partitions, s.replication, min_insync=s.min_insync)
        # T1/T2 over the platform: evaluated by the worker holding partition 0 (ADR-0020).
        self.monitor = CapacityMonitor(params, views, partition_count(s.bootstrap, s.topic))
        datadir = s.datadir or Path(tempfile.mkdtemp(prefix="fanout-worker-"))
        self.app = app = WorkerApp(
            s.group,
            broker=f"kafka://{s.bootstrap.split(',')[0]}",
            broker_consumer=[f"kafka://{h}" for h in s.bootstrap.split(",")],
            broker_producer=[f"kafka://{h}" for h in s.bootstrap.split(",")],
            store="memory://",
            datadir=str(datadir),
            web_enabled=False,
            web_host="127.0.0.1",
            web_port=s.web_port or free_port(),
            topic_disable_leader=True,
            topic_replication_factor=s.replication,
            consumer_auto_offset_reset="earliest",
            broker_session_timeout=s.session_timeout,
            broker_heartbeat_interval=s.heartbeat,
            broker_rebalance_timeout=max(s.session_timeout, 10.0),
            broker_request_timeout=max(s.session_timeout * 2, 30.0),
        )
        self.topic = app.topic(s.topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        self.assigned: set[int] = set()
        app.agent(self.topic, name="fanout-projections", concurrency=1)(self._agent)
        app.on_partitions_revoked.connect(cast(Any, self._revoked))
        app.on_partitions_assigned.connect(cast(Any, self._assigned))
        if beat is not None:
            app.timer(BEAT_INTERVAL, on_leader=False)(self._heartbeat)
        app.timer(CAPACITY_INTERVAL, on_leader=False)(self._evaluate_capacity)

    async def _evaluate_capacity(self) -> None:
        if 0 in self.assigned:
            await self.applier.evaluate_capacity(self.monitor)

    def heartbeat(self, *, leaving: bool = False) -> WorkerBeat:
        st = self.host.stats
        counters = {
            "units": st.units,
            "failures": st.failures,
            "fenced": st.fenced + self.monitor.fenced,
            "heals": st.heals,
            "reread": st.reread,
        }
        # The mailbox layer's write time per entry (re-review condition 4, ADR-0026), when the
        # composition root timed the views' mailbox store (fanout.rereview.MailboxMeter).
        meter: Any = getattr(self.host.views, "mailbox", None)
        if hasattr(meter, "seconds") and hasattr(meter, "entries"):
            counters["mailbox_write_us"] = int(meter.seconds * 1e6)
            counters["mailbox_entries"] = int(meter.entries)
        b = WorkerBeat(self.worker_id, tuple(sorted(self.assigned)), time.time(), BEAT_INTERVAL, leaving, counters)
        if self._beat is not None:
            try:
                self._beat(b)
            except Exception:
                log.exception("could not send a heartbeat")
        return b

    async def _heartbeat(self) -> None:
        self.heartbeat()

    async def _agent(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch, within=self.settings.within):
            by_partition = group_by_partition(
                (e.message.partition, e.message.headers, e.message.value, e.message.offset) for e in events
            )
            await self.applier.apply(by_partition)

    def _ours(self, tps: Iterable[Any]) -> set[int]:
        return {tp.partition for tp in tps if tp.topic == self.settings.topic}

    async def _revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        parts = self._ours(args[0] if args else kwargs.get("revoked", ()))
        self.assigned -= parts
        if parts:
            log.info("partitions %s revoked: their working sets are forgotten", sorted(parts))
            await self.applier.forget(parts)

    async def _assigned(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        self.assigned = self._ours(args[0] if args else kwargs.get("assigned", ()))
        log.info("partitions assigned: %s", sorted(self.assigned))

    def run(self, loglevel: str = "info") -> None:
        """Run the worker in this (main) thread until a signal stops it."""
        worker = faust.Worker(self.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
        worker.spinner = None  # a terminal spinner: noise in a log file
        try:
            worker.execute_from_commandline()
        finally:
            self.heartbeat(leaving=True)
            self.applier.close()
            self.log_reader.close()
