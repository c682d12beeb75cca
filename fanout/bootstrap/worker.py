"""A projection worker of the distributed runtime (`fanout worker`): the Faust app consuming
the event topic (`streams/worker.py`), hosting the projections over the views (Cassandra,
or the SQLite views of one data dir for a single worker), publishing pushes and heartbeats
to `<topic>.pushes` and opening the reviews its capacity projection triggers
(`fanout/effects.py`). `cli/worker.py` parses the command line and calls `bootstrap_worker`.

Every failure the operator can fix at start-up is a `WorkerError`: one line naming the
setting and what to do."""

from __future__ import annotations

import gc
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.postgres.connect import EventStoreUnavailable, check_event_store
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap.embedded import DataDirLock, open_mailbox, open_views
from fanout.bootstrap.event_store import postgres_event_store
from fanout.bootstrap.replica import open_cassandra_views
from fanout.config import EngineUnavailable
from fanout.effects import Effects, open_review
from fanout.rereview import MailboxMeter
from fanout.urls import UrlError, cassandra_settings, kafka_settings, postgres_env
from projections.capacity import ReviewTrigger
from projections.ports import ViewStore

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


class WorkerError(EngineUnavailable):
    """A failure the operator can fix: one line, exit 2."""


@dataclass(frozen=True)
class WorkerOptions:
    """The command line's knobs (`fanout worker --help`)."""

    app_id: str | None = None
    web_port: int = 0
    batch: int = 500
    within: float = 0.05
    unit_events: int = 4000  # ADR-0052
    gather_for: float = 1.0
    session_timeout: float = 10.0


class WorkerProcess:
    """A built worker: `run()` until SIGINT/SIGTERM, then `close()` (always)."""

    def __init__(self) -> None:
        self.worker: Any = None
        self.description = ""
        self.health: Any = None
        self._closers: list[Callable[[], Any]] = []

    def on_close(self, close: Callable[[], Any]) -> None:
        self._closers.append(close)

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
        for close in reversed(self._closers):
            try:
                close()
            except Exception:
                log.exception("closing failed")
        self._closers.clear()


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def kafka_down(brokers: str, exc: BaseException) -> str:
    return (
        f"FANOUT_LOG: Kafka at {brokers} does not answer ({_line(exc)}): start it, "
        "or name the right host and port in FANOUT_LOG"
    )


def _open_views(url: str, data_dir: str | None, params: Parameters, partitions: int, built: WorkerProcess) -> ViewStore:
    if url == "sqlite":
        if not data_dir:
            raise WorkerError("FANOUT_VIEWS=sqlite needs --data-dir or FANOUT_DATA_DIR")
        path = Path(data_dir)
        path.mkdir(parents=True, exist_ok=True)
        lock = DataDirLock(path)
        lock.acquire()
        built.on_close(lock.release)
        # timed: the mailbox layer's unit cost, in the heartbeats (re-review condition 4, ADR-0026)
        return open_views(path, params.mailbox_shards, mailbox=MailboxMeter(open_mailbox(path, params.mailbox_shards)))
    try:
        return open_cassandra_views(cassandra_settings(url), partitions=partitions)
    except Exception as exc:
        raise WorkerError(f"FANOUT_VIEWS: Cassandra at {url} does not answer: {_line(exc)}") from None


def check_settings(env: Mapping[str, str]) -> None:
    """The engine URLs a worker needs, checked before any engine is opened."""
    store_url = env.get("FANOUT_EVENT_STORE", "")
    if not store_url.startswith(("postgresql://", "postgres://")):
        raise WorkerError(
            f"FANOUT_EVENT_STORE={store_url!r}: the worker needs the PostgreSQL event store (postgresql://...)"
        )
    try:
        kafka_settings(env.get("FANOUT_LOG", ""))
        views_url = env.get("FANOUT_VIEWS", "")
        if views_url.startswith("cassandra://"):
            cassandra_settings(views_url)  # a malformed URL stops here, before any engine is opened
        elif views_url != "sqlite":
            raise WorkerError(f"FANOUT_VIEWS={views_url!r}: expected a cassandra:// URL or sqlite")
        postgres_env(store_url)
    except UrlError as exc:
        raise WorkerError(str(exc)) from None


def bootstrap_worker(
    env: Mapping[str, str], params: Parameters, options: WorkerOptions, data_dir: str | None = None
) -> WorkerProcess:
    """A projection worker over the engines `env` names (FANOUT_EVENT_STORE, FANOUT_LOG,
    FANOUT_VIEWS); `data_dir` holds the views when FANOUT_VIEWS=sqlite."""
    from confluent_kafka import KafkaException

    from streams.kafka import TopicUnavailable, ensure_topic
    from streams.kafka_health import process_health
    from streams.pushes import PushPublisher, pushes_topic
    from streams.records import MAX_RECORD_BYTES, EventRecord
    from streams.worker import ProjectionWorker, WorkerSettings

    check_settings(env)
    kafka = kafka_settings(env["FANOUT_LOG"])
    views_url = env["FANOUT_VIEWS"]
    built = WorkerProcess()
    try:
        # Kafka's clients say "unreachable" once and then a summary, not a line per attempt; muted
        # until the worker runs (a start-up failure is this command's one line).
        built.health = health = process_health(kafka.brokers)
        health.muted = True
        store_env = postgres_event_store(env["FANOUT_EVENT_STORE"])
        try:
            check_event_store(store_env)  # names the URL and what to do, not "couldn't get a connection"
            app = FanoutApplication(params, store_env, shared_store=True)  # replicas and workers write too
        except EventStoreUnavailable as exc:
            raise WorkerError(str(exc)) from None
        except Exception as exc:
            raise WorkerError(f"FANOUT_EVENT_STORE: cannot open the event store: {_line(exc)}") from None
        built.on_close(app.close)
        views = _open_views(views_url, data_dir, params, kafka.partitions, built)
        built.on_close(views.close)
        try:
            # the event topic, ensured here once per worker process (the worker reads its count)
            ensure_topic(
                kafka.brokers,
                kafka.topic,
                kafka.partitions,
                kafka.replication,
                max_message_bytes=MAX_RECORD_BYTES,
                timeout=15.0,
                min_insync=kafka.min_insync,
            )
            publisher = PushPublisher(
                kafka.brokers,
                pushes_topic(kafka.topic),
                partitions=kafka.partitions,
                replication=kafka.replication,
                min_insync=kafka.min_insync,
                on_delivered=health.reachable,  # a heartbeat acknowledged: Kafka answers
            )
        except (KafkaException, TopicUnavailable) as exc:
            raise WorkerError(kafka_down(kafka.brokers, exc)) from None
        built.on_close(publisher.close)

        def to_domain_event(record: EventRecord) -> Any:
            return app.mapper.to_domain_event(record.stored_event())

        # after each committed unit: the worker publishes the pushes (invariant O), then the reviews open
        effects = Effects({ReviewTrigger: [open_review(app)]})
        faust_dir = Path(tempfile.mkdtemp(prefix="fanout-worker-"))
        built.on_close(lambda: shutil.rmtree(faust_dir, ignore_errors=True))
        try:
            built.worker = ProjectionWorker(
                WorkerSettings(
                    brokers=kafka.brokers,
                    topic=kafka.topic,
                    replication=kafka.replication,
                    app_id=options.app_id,
                    web_port=options.web_port,
                    datadir=faust_dir,
                    batch=options.batch,
                    within=options.within,
                    unit_events=options.unit_events,
                    gather_for=options.gather_for,
                    session_timeout=options.session_timeout,
                ),
                views,
                params,
                to_domain_event,
                effects,
                beat=publisher.beat,
                publish=publisher.publish,
            )
        except (KafkaException, TopicUnavailable, LookupError) as exc:
            raise WorkerError(kafka_down(kafka.brokers, exc)) from None
        built.description = (
            f"worker {built.worker.settings.group} consuming {kafka.topic} at {kafka.brokers} (read_committed), "
            f"pushes to {pushes_topic(kafka.topic)}, views {views_url}"
        )
        return built
    except BaseException:
        built.close()
        raise
