"""A projection worker of the distributed runtime (`fanout worker`): the Faust app consuming
the event topic (`streams/worker.py`), hosting the projections over the views (Cassandra,
or the SQLite views of one data dir for a single worker), publishing pushes and heartbeats
to `<topic>.pushes` and opening the reviews its capacity projection triggers
(`fanout/effects.py`). `cli/worker.py` loads the settings (`load_settings(role="worker")`: the
engine URLs checked there, the command line's knobs in `Settings.worker`) and calls
`bootstrap_worker`.

An engine that does not answer at start-up is an `EngineUnavailable`: one line naming the
setting and what to do."""

from __future__ import annotations

import gc
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventsourcing.persistence import Mapper

from adapters.postgres.connect import EventStoreUnavailable, check_event_store
from fanout.application import FanoutApplication
from fanout.bootstrap.embedded import DataDirLock, open_views
from fanout.bootstrap.event_store import postgres_event_store
from fanout.bootstrap.replica import open_cassandra_views
from fanout.config import EngineUnavailable, Settings
from fanout.effects import Effects, open_review
from fanout.rereview import MailboxMeter
from fanout.urls import cassandra_settings, kafka_settings
from projections.capacity import ReviewTrigger
from projections.failures import first_line
from projections.ports import ViewStore

if TYPE_CHECKING:  # Faust and Kafka's client are imported when the worker is built
    from streams.kafka_health import KafkaHealth
    from streams.records import EventRecord
    from streams.worker import ProjectionWorker

log = logging.getLogger("fanout.worker")

# CPython's cyclic collector in a worker (ADR-0054): the driver leaves ~28 objects in cycles a
# request (its ResponseFuture, timer, query plan, condition) and the host's caches make a full
# collection ~100 ms; at the default (700, 10, 10) the collector took 12-14% of a worker's CPU
# at 1,000 messages/s, about 4% at these thresholds.
COLLECTOR_THRESHOLDS = (50_000, 20, 100)


def tune_collector() -> None:
    """Freeze what start-up built (never scanned again) and collect the young generation every
    COLLECTOR_THRESHOLDS[0] allocations: a worker's cyclic garbage is still collected, less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


class WorkerProcess:
    """A built worker: `run()` until SIGINT/SIGTERM, then `close()` (always: it runs
    `closers`, what the root opened, in reverse)."""

    def __init__(
        self,
        worker: ProjectionWorker,
        health: KafkaHealth,
        description: str,
        closers: list[Callable[[], Any]],
    ) -> None:
        self.worker = worker
        self.health = health
        self.description = description
        self._closers = closers

    def run(self, loglevel: str) -> int:
        self.health.unmute()
        tune_collector()
        try:
            self.worker.run(loglevel)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 0
        return 0

    def stats(self) -> Any:
        return self.worker.host.stats

    def close(self) -> None:
        close_all(self._closers)


def close_all(closers: list[Callable[[], Any]]) -> None:
    """Run every closer, the last opened first; a failing one is logged, the rest still run."""
    for close in reversed(closers):
        try:
            close()
        except Exception:
            log.exception("closing failed")
    closers.clear()


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(str(exc))}"


def kafka_down(brokers: str, exc: BaseException) -> str:
    return (
        f"FANOUT_LOG: Kafka at {brokers} does not answer ({_line(exc)}): start it, "
        "or name the right host and port in FANOUT_LOG"
    )


def domain_event(mapper: Mapper[Any], record: EventRecord) -> Any:
    """The domain event a record of the event topic carries, decoded by the application's
    mapper (its transcoder and topics), as the embedded runtime's notification log does."""
    return mapper.to_domain_event(record.stored_event())


def _open_views(
    settings: Settings, partitions: int, meter: MailboxMeter, closers: list[Callable[[], Any]]
) -> ViewStore:
    """The views the worker writes, their mailbox writes timed by `meter` (the mailbox layer's
    unit cost, in the heartbeats: re-review condition 4, ADR-0026)."""
    params = settings.params
    if settings.views == "sqlite":  # one worker over a data dir (load_settings checked it names one)
        path = settings.data_dir
        path.mkdir(parents=True, exist_ok=True)
        lock = DataDirLock(path)
        lock.acquire()
        closers.append(lock.release)
        return open_views(path, params.mailbox_shards, timer=meter)
    try:
        return open_cassandra_views(cassandra_settings(settings.views), partitions=partitions, timer=meter)
    except Exception as exc:
        raise EngineUnavailable(f"FANOUT_VIEWS: Cassandra at {settings.views} does not answer: {_line(exc)}") from None


def bootstrap_worker(settings: Settings) -> WorkerProcess:
    """A projection worker over the engines the settings name (FANOUT_EVENT_STORE, FANOUT_LOG,
    FANOUT_VIEWS: `load_settings(role="worker")` checked them), with the knobs of
    `settings.worker`; the data dir holds the views when FANOUT_VIEWS=sqlite."""
    from confluent_kafka import KafkaException

    from streams.kafka import TopicUnavailable, ensure_event_topic
    from streams.kafka_health import process_health
    from streams.pushes import PushPublisher, pushes_topic
    from streams.worker import ProjectionWorker, WorkerSettings

    kafka = kafka_settings(settings.log)
    closers: list[Callable[[], Any]] = []
    try:
        # Kafka's clients say "unreachable" once and then a summary, not a line per attempt; muted
        # until the worker runs (a start-up failure is this command's one line).
        health = process_health(kafka.brokers)
        health.muted = True
        store_env = postgres_event_store(settings.event_store)
        try:
            check_event_store(store_env)  # names the URL and what to do, not "couldn't get a connection"
            app = FanoutApplication(settings.params, store_env, shared_store=True)  # replicas and workers write too
        except EventStoreUnavailable as exc:
            raise EngineUnavailable(str(exc)) from None
        except Exception as exc:
            raise EngineUnavailable(f"FANOUT_EVENT_STORE: cannot open the event store: {_line(exc)}") from None
        closers.append(app.close)
        meter = MailboxMeter()
        views = _open_views(settings, kafka.partitions, meter, closers)
        closers.append(views.close)
        try:
            ensure_event_topic(kafka)  # here once per worker process (the worker reads its count)
            # a heartbeat acknowledged: Kafka answers
            publisher = PushPublisher.of_log(kafka, on_delivered=health.reachable)
        except (KafkaException, TopicUnavailable) as exc:
            raise EngineUnavailable(kafka_down(kafka.brokers, exc)) from None
        closers.append(publisher.close)
        # after each committed unit: the worker publishes the pushes (invariant O), then the reviews open
        effects = Effects({ReviewTrigger: [open_review(app)]})
        faust_dir = Path(tempfile.mkdtemp(prefix="fanout-worker-"))
        closers.append(partial(shutil.rmtree, faust_dir, ignore_errors=True))
        try:
            worker = ProjectionWorker(
                WorkerSettings(
                    brokers=kafka.brokers,
                    topic=kafka.topic,
                    replication=kafka.replication,
                    datadir=faust_dir,
                    **asdict(settings.worker),  # the command line's knobs (fanout/config.py WorkerOptions)
                ),
                views,
                settings.params,
                partial(domain_event, app.mapper),
                effects,
                beat=publisher.beat,
                publish=publisher.publish,
                mailbox_timer=meter,
            )
        except (KafkaException, TopicUnavailable, LookupError) as exc:
            raise EngineUnavailable(kafka_down(kafka.brokers, exc)) from None
        description = (
            f"worker {worker.settings.group} consuming {kafka.topic} at {kafka.brokers} (read_committed), "
            f"pushes to {pushes_topic(kafka.topic)}, views {settings.views}"
        )
        return WorkerProcess(worker, health, description, closers)
    except BaseException:
        close_all(closers)
        raise
