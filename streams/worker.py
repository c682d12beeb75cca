"""The projection worker (`fanout worker`): a Faust app whose one agent hands the records of
the event topic the relay writes (`streams/records.py`) to the projection host
(`streams/host.py`, the same unit of work as the embedded runtime's and the rebuild's).

* **One unit of work per take, larger when behind.** The agent takes up to `batch` events
  within `within` seconds (`stream.take_events`), groups them by Kafka partition and hands
  them to the host in a single-thread executor (`loop.run_in_executor`): the Faust event loop
  never waits on a view store, and the units of one worker never overlap (the view stores are
  not required to take concurrent units from one process). While takes come back full with
  a whole take already waiting (the log is ahead of the worker) it gathers several into one
  unit, up to `unit_events` events or `gather_for` seconds, holding their acks until the unit
  has committed (`gathers_more`, ADR-0052).
* **Idempotence by tracking, not by Kafka offsets** (the host's). The consumer commits each
  partition's highest acked offset + 1 (`streams/read_committed.py`, ADR-0044), acked after the
  take is handled, so the group's committed offsets follow the views and a restarted worker is
  handed almost nothing again; behind the views is harmless, ahead is caught by the host.
* **A failed unit** is logged once (then once per interval while it keeps failing) and the
  same records are retried after a short backoff: nothing is acked or skipped (`Applier`).
* **Revocation** forgets the revoked partitions' working sets and tracked positions (another
  worker may advance them); they are reloaded if the partition comes back.
* **read_committed.** The relay writes in Kafka transactions; a record of an aborted one is
  never applied: the app is `streams/read_committed.py` `WorkerApp`.
* **Effects after the commit**: `publish(effects)` queues the pushes and the positions the
  commit left on the pushes topic (`streams/pushes.py` PushPublisher.publish), then
  `on_effects(effects)` acts on the rest (the root's handlers, `fanout/effects.py`: the
  reviews); their exceptions are logged, never fatal.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import faust
from confluent_kafka import KafkaException

from domain.params import Parameters
from projections.capacity_monitor import CapacityMonitor
from projections.errors import StorageError
from projections.failures import Throttled, storage_failure
from projections.hosting import Effect
from projections.ports import MailboxTimer, ViewStore
from streams.heartbeats import BEAT_INTERVAL, WorkerBeat, worker_id
from streams.host import Fenced, ProjectionHost, Record
from streams.kafka import partition_count
from streams.log_reader import KafkaPartitionReader, LogGapUnreadable
from streams.read_committed import WorkerApp
from streams.records import BadRecord, EventRecord, decode

log = logging.getLogger("fanout.worker")

RETRY_AFTER_FAILURE = 0.5  # seconds between attempts at a failing unit of work
CAPACITY_INTERVAL = 1.0  # seconds between evaluations of T1/T2 over the merged windows


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


def engine_unavailable(exc: BaseException) -> bool:
    """An engine away or overloaded (a store's StorageError, Kafka's client error, a socket
    error), as opposed to a bug: the worker logs the first kind in one line."""
    return isinstance(exc, OSError | TimeoutError | StorageError | KafkaException)


class Applier:
    """The asyncio side: hands each partition's records to the host on the executor and
    retries a failed unit after a backoff until it commits."""

    def __init__(self, host: ProjectionHost, *, backoff: float = RETRY_AFTER_FAILURE) -> None:
        self.host = host
        self.backoff = backoff
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fanout-worker-unit")
        self._throttled = Throttled(log)
        self.last_error: str | None = None

    async def apply(self, by_partition: Mapping[int, Sequence[Record]]) -> None:
        """The take's records of every partition, in one unit of work where the rules allow
        (ProjectionHost.apply_take), retried after a failure until they commit."""
        loop = asyncio.get_running_loop()
        held = ",".join(map(str, sorted(by_partition)))
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
                    log.error("unit of work of partitions %s failed: %s; retrying it", held, self.last_error)
                elif failures == 1:  # anything else may be a bug: its stack
                    log.exception("unit of work of partitions %s failed (%s); retrying it", held, reason)
                else:
                    self._throttled("failing", logging.ERROR, "partitions %s still failing: %s", held, self.last_error)
                await asyncio.sleep(self.backoff)
        if failures:
            log.warning("partitions %s recovered after %d failed attempts", held, failures)
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


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """The knobs of `fanout worker` are fanout/config.py WorkerOptions (their defaults are
    written there); the composition root hands them in with FANOUT_LOG's."""

    brokers: str  # host:port[,host:port]
    topic: str  # the event topic (it exists: the composition root ensures it, streams/kafka.py)
    replication: int  # FANOUT_LOG's: Faust's topic_replication_factor
    app_id: str | None  # the consumer group; None: worker_group(topic)
    web_port: int  # Faust's web server on 127.0.0.1; 0: a free port
    batch: int  # events per take
    within: float  # seconds a take waits for more
    unit_events: int  # events a unit may gather from full takes while the log is behind (ADR-0052)
    gather_for: float  # seconds a unit may spend gathering them
    session_timeout: float  # a dead worker's partitions move after this
    datadir: Path | None = None  # Faust's data dir (nothing durable is kept there); default a temp dir
    heartbeat: float = 1.0
    max_entries_per_commit: int = 200_000

    @property
    def group(self) -> str:
        return self.app_id or worker_group(self.topic)


def worker_group(topic: str) -> str:
    """The consumer group of the workers of an event topic (when no --app-id names another)."""
    return f"fanout-worker.{topic}"


def gathers_more(took: int, waiting: int, gathered: int, waited: float, settings: WorkerSettings) -> bool:
    """Whether the agent takes another take into the unit it is gathering (ADR-0052): only
    when the last take came back full and a whole take's events are already `waiting` in
    Faust's buffer (the log is behind this worker: the next take fills at once, nobody waits
    for it), the unit stays within `unit_events` and it has gathered for under `gather_for`
    seconds. A worker that keeps up applies each take as it comes (no added latency); one that
    falls behind applies fewer, larger units, and a unit's cost in Cassandra grows slower than
    its events (its mailbox partitions, a conversation's and a user's rows are written once)."""
    full = took >= settings.batch and waiting >= settings.batch
    return full and gathered + settings.batch <= settings.unit_events and waited < settings.gather_for


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _publish_then(
    publish: Callable[[Sequence[Effect]], Any], on_effects: Callable[[Sequence[Effect]], None] | None
) -> Callable[[Sequence[Effect]], None]:
    """After a commit: the pushes and positions to Kafka first (invariant O), then the rest."""

    def after_commit(effects: Sequence[Effect]) -> None:
        try:
            publish(effects)
        except Exception:
            log.exception("could not publish the pushes of a committed unit (the mailbox serves them)")
        if on_effects is not None:
            on_effects(effects)

    return after_commit


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
        publish: Callable[[Sequence[Effect]], Any] | None = None,
        mailbox_timer: MailboxTimer | None = None,
    ) -> None:
        """`mailbox_timer`: the timer the views report their mailbox writes to, whose totals
        the heartbeats carry (re-review condition 4, ADR-0026)."""
        self.settings = s = settings
        self.mailbox_timer = mailbox_timer
        if publish is not None:
            on_effects = _publish_then(publish, on_effects)
        self.worker_id = worker_id()
        self._beat = beat
        self.log_reader = KafkaPartitionReader(s.brokers, s.topic)
        self.host = ProjectionHost(
            views,
            params,
            to_domain_event,
            on_effects,
            max_entries_per_commit=s.max_entries_per_commit,
            triggers=False,
            log_reader=self.log_reader,
        )
        self.applier = Applier(self.host)
        # T1/T2 over the platform: evaluated by the worker holding partition 0 (ADR-0020).
        self.monitor = CapacityMonitor(params, views, partition_count(s.brokers, s.topic))
        datadir = s.datadir or Path(tempfile.mkdtemp(prefix="fanout-worker-"))
        self.app = app = WorkerApp(
            s.group,
            broker=f"kafka://{s.brokers.split(',')[0]}",
            broker_consumer=[f"kafka://{h}" for h in s.brokers.split(",")],
            broker_producer=[f"kafka://{h}" for h in s.brokers.split(",")],
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
        timer = self.mailbox_timer  # the mailbox layer's write time per entry (ADR-0026)
        if timer is not None:
            counters["mailbox_write_us"] = int(timer.seconds * 1e6)
            counters["mailbox_entries"] = int(timer.entries)
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
        gathered: list[Any] = []  # the events of the unit being gathered, their acks held (ADR-0052)
        started = 0.0
        async for events in stream.take_events(self.settings.batch, within=self.settings.within):
            if not gathered:
                started = time.monotonic()
            gathered.extend(events)
            waiting = stream.channel.queue.qsize()  # events Faust holds for the next take already
            if gathers_more(len(events), waiting, len(gathered), time.monotonic() - started, self.settings):
                for e in events:  # take_events acks them when the next take starts: not before they apply
                    e.message.incref()
                continue
            unit, gathered = gathered, []
            by_partition = group_by_partition(
                (e.message.partition, e.message.headers, e.message.value, e.message.offset) for e in unit
            )
            await self.applier.apply(by_partition)
            for e in unit[: len(unit) - len(events)]:  # the held ones; take_events acks the last take's
                await stream.ack(e)

    def _ours(self, tps: Iterable[Any]) -> set[int]:
        return {tp.partition for tp in tps if tp.topic == self.settings.topic}

    async def _revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        revoked = self._ours(args[0] if args else kwargs.get("revoked", ()))
        self.assigned -= revoked
        if revoked:
            log.info("partitions %s revoked: their working sets are forgotten", sorted(revoked))
            await self.applier.forget(revoked)

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
