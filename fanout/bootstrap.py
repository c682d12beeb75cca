"""The composition root (cosmicpython's `bootstrap`): the one place that picks the
engines and the projection host and wires them to the service layer.

`bootstrap(settings, data_dir)` builds the embedded runtime: eventsourcing's SQLite
event store, the SQLite views with the RocksDB mailbox (ADR-0004), the in-process
runner (`streams/embedded.py`) and the push hub, behind the data dir's lock. A caller
passes its own adapters instead (`views=`, `mailbox=`, `event_store_env=`; tests do).
The operator tools open the same stores through `open_views`, `open_mailbox` and
`open_application`, so which engine holds what is decided here only."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.rocksdb.mailbox import RocksMailbox
from adapters.sqlite.views import SqliteViews
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.config import ConfigError, EngineUnavailable, Settings, is_distributed
from fanout.distributed import Closeable, DistributedRuntime
from fanout.embedded import EmbeddedRuntime
from fanout.rereview import MailboxMeter
from fanout.runtime import Runtime
from fanout.urls import CassandraSettings, KafkaSettings, cassandra_settings, kafka_settings, postgres_env
from projections.delivery import Delivered
from projections.hosting import Effect, ViewsTracked
from projections.ports import MailboxStore, ViewStore
from streams.embedded import EmbeddedRunner
from streams.routing import conversation_partition

if TYPE_CHECKING:  # the distributed engines' clients are imported when that runtime is built
    from adapters.cassandra.rebuild import CassandraAsideBuilds
    from adapters.cassandra.views import CassandraViews

log = logging.getLogger("fanout.runtime")

# (FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS) this build can run.
EMBEDDED_ENGINES = ("sqlite", "embedded", "sqlite")


class DataDirBusy(RuntimeError):
    pass


def _embedded_runner(
    views: ViewStore, params: Parameters, app: FanoutApplication, on_effects: Callable[[Sequence[Effect]], None]
) -> EmbeddedRunner:
    """The embedded runtime's projector: the notification log into the one projection host."""
    return EmbeddedRunner(app, views, params, on_effects=on_effects)


class DataDirLock:
    """One writer process per data dir (serve, rebuild): an exclusive flock."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "fanout.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirBusy(
                f"{self.path.parent} is in use by another fanout process (serve or rebuild); stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- the engines of a data dir ----------------------------------------------------------


def sqlite_event_store(data_dir: Path) -> dict[str, str]:
    """eventsourcing's environment for the SQLite event store of a data dir."""
    return {
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "SQLITE_DBNAME": str(data_dir / "events.sqlite"),
        "SQLITE_LOCK_TIMEOUT": "30",
    }


def open_mailbox(data_dir: Path | str, shards: int, *, prefix: str = "") -> RocksMailbox:
    """The mailbox store (UserMailboxEntry): RocksDB, one column family per MailboxShard."""
    return RocksMailbox(Path(data_dir) / f"{prefix}mailbox.rocksdb", shards)


def open_views(
    data_dir: Path | str, shards: int, *, prefix: str = "", mailbox: MailboxStore | None = None
) -> SqliteViews:
    """The views of a data dir (or a set built aside, named by `prefix`) with their
    mailbox store: RocksDB unless one is given. The views own it (closing closes both)."""
    mailbox = open_mailbox(data_dir, shards, prefix=prefix) if mailbox is None else mailbox
    try:
        return SqliteViews(data_dir, mailbox, prefix=prefix)
    except BaseException:
        mailbox.close()
        raise


class NoMailbox:
    """The mailbox store of views opened beside a running `serve` (RocksDB admits one
    process): for tools that read heads and states only. Any mailbox access is a bug."""

    def _refuse(self, *_: Any) -> Any:
        raise RuntimeError("these views were opened without their mailbox store")

    write = read = count = all_entries = sort_key = flush = reopen = _refuse

    def close(self) -> None:
        pass


def open_views_only(data_dir: Path | str, *, readonly: bool = False) -> SqliteViews:
    """The views of a data dir without the mailbox store: readable beside a running serve
    (`readonly`: not even a schema migration is written)."""
    return SqliteViews(data_dir, NoMailbox(), readonly=readonly)


def open_application(
    params: Parameters,
    data_dir: Path | str,
    *,
    env: Mapping[str, str] | None = None,
    create_tables: bool = True,
    **wiring: Any,
) -> FanoutApplication:
    """The command side over the data dir's event store (or the one `env` names).
    `create_tables=False` opens an existing store only (the tools that read beside serve)."""
    store = dict(sqlite_event_store(Path(data_dir)) if env is None else env)
    if not create_tables:
        store["CREATE_TABLE"] = "n"
    return FanoutApplication(params, store, **wiring)


# -- the composition root ---------------------------------------------------------------


def open_runtime(settings: Settings, data_dir: Path | str | None = None) -> Runtime:
    """The runtime the settings name: the distributed one for postgresql://, kafka:// and
    cassandra:// URLs, else the embedded one over the data dir (`fanout serve`)."""
    if is_distributed(settings):
        return bootstrap_distributed(settings)
    return bootstrap(settings, data_dir)


def bootstrap(
    settings: Settings | Parameters | None = None,
    data_dir: Path | str | None = None,
    *,
    clock: Callable[[], float] = time.time,
    views: ViewStore | None = None,
    mailbox: MailboxStore | None = None,
    event_store_env: Mapping[str, str] | None = None,
    lock: bool = True,
) -> EmbeddedRuntime:
    """The embedded runtime over `data_dir` (default: the settings' data dir); settings
    naming the distributed engines go to `open_runtime` / `bootstrap_distributed`.

    `settings` is the loaded configuration (`fanout.config.load_settings`), or just the
    ADR parameters (default ones when None). Adapters given here are used instead of the
    ones built from the data dir, and the runtime owns them (close() closes them).
    `lock=False` skips the data dir's lock (a caller that holds it, like the demo)."""
    if isinstance(settings, Settings):
        engines = (settings.event_store, settings.log, settings.views)
        if engines != EMBEDDED_ENGINES:
            raise ConfigError(
                f"engines {engines}: bootstrap builds the embedded runtime {EMBEDDED_ENGINES}; the distributed one "
                "(postgresql://, kafka://, cassandra://) is built by open_runtime / bootstrap_distributed"
            )
        params, data_dir = settings.params, settings.data_dir if data_dir is None else data_dir
    else:
        params = settings or Parameters()
    if data_dir is None:
        raise ValueError("bootstrap needs a data dir (or settings that name one)")
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_lock = DataDirLock(data_dir) if lock else None
    if data_lock is not None:
        data_lock.acquire()
    built: ViewStore | None = None
    try:
        meter: MailboxMeter | None = None
        if views is None:
            # the mailbox layer's write time per entry: re-review condition 4 (ADR-0026)
            if mailbox is None:  # a mailbox handed in (tests) is used as it is, untimed
                mailbox = meter = MailboxMeter(open_mailbox(data_dir, params.mailbox_shards))
            views = built = open_views(data_dir, params.mailbox_shards, mailbox=mailbox)
        return EmbeddedRuntime(
            data_dir,
            params,
            views,
            sqlite_event_store(data_dir) if event_store_env is None else event_store_env,
            clock=clock,
            lock=data_lock,
            meter=meter,
            projector=partial(_embedded_runner, views, params),
        )
    except BaseException:
        if built is not None:
            built.close()
        if data_lock is not None:
            data_lock.release()
        raise


# -- the distributed runtime --------------------------------------------------------------


class KafkaEngines:
    """What an API replica asks of Kafka: the relay's committed position, the live workers
    (their heartbeats on the pushes topic) and the online pushes the workers publish."""

    def __init__(self, kafka: KafkaSettings) -> None:
        from streams.kafka_health import process_health
        from streams.pushes import WorkerBeats

        self.kafka = kafka
        self.beats = WorkerBeats()
        # Kafka down: one line and a summary every 30 s, not librdkafka's line per attempt
        self.health = process_health(kafka.bootstrap)
        # One long-lived client, one caller at a time: a client created and destroyed per check
        # while the broker restarted aborted the process inside librdkafka.
        self._lock = threading.Lock()
        self._consumer: Any = None
        self._subscribed = False

    def relayed_position(self) -> int:
        from streams.relay import position_consumer, relayed_position

        with self._lock:
            if self._consumer is None:
                self._consumer = position_consumer(self.kafka.bootstrap)
            try:
                position = relayed_position(
                    self.kafka.bootstrap, self.kafka.topic, timeout=5.0, consumer=self._consumer
                )
            except Exception as exc:
                self.health.failed(f"{type(exc).__name__}: {exc}")
                raise
            self.health.reachable()
            return position

    def workers(self) -> int:
        """Workers whose heartbeat reached this replica lately (ADR-0019): no admin request
        to Kafka's group coordinator (one in flight during a broker restart aborted the
        process inside librdkafka)."""
        if not self._subscribed:
            raise RuntimeError("the workers are known from their heartbeats: subscribe_pushes first")
        return self.beats.count()

    def worker_partitions(self) -> set[int]:
        return self.beats.partitions()

    def worker_counters(self) -> dict[str, dict[str, int]]:
        return self.beats.counters()

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def subscribe_pushes(
        self, callback: Callable[[Delivered], None], on_tracked: Callable[[ViewsTracked], None] | None = None
    ) -> Closeable:
        from confluent_kafka import KafkaException

        from streams.kafka import TopicUnavailable
        from streams.pushes import PushSubscriber, pushes_topic

        muted, self.health.muted = self.health.muted, True  # a start-up failure is one line (below)
        try:
            sub = PushSubscriber(
                self.kafka.bootstrap,
                pushes_topic(self.kafka.topic),
                callback,
                on_beat=self.beats.seen,
                on_tracked=on_tracked,
                replication=self.kafka.replication,
                min_insync=self.kafka.min_insync,
                partitions=self.kafka.partitions,
            ).start()
        except (KafkaException, TopicUnavailable) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EngineUnavailable(
                f"FANOUT_LOG: Kafka at {self.kafka.bootstrap} does not answer ({first}): start it, "
                "or name the right host and port in FANOUT_LOG"
            ) from None
        finally:
            self.health.muted = muted
        self.health.reachable()
        self._subscribed = True

        class Subscription:
            def close(self) -> None:
                sub.stop()

        return Subscription()


def consumer_group_members(bootstrap: str, group: str, timeout: float = 5.0, *, admin: Any = None) -> int:
    """Members of a Kafka consumer group (0 when it is empty or unknown). A caller that
    asks often passes its own long-lived AdminClient."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    if admin is None:
        admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000)})
    deadline = time.monotonic() + timeout
    while True:
        futures = admin.describe_consumer_groups([group], request_timeout=timeout)
        try:
            description = futures[group].result(timeout=timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = getattr(error, "code", lambda: None)()
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return 0
            # The group's coordinator moving or loading (NOT_COORDINATOR seen by the e2e
            # suite): ask again within the timeout, not "the workers are unknown"
            moving = (
                KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                KafkaError.COORDINATOR_NOT_AVAILABLE,
            )
            transient = code in moving or getattr(error, "retriable", lambda: False)()
            if transient and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise
        return len(description.members)


def open_cassandra_views(settings: CassandraSettings, *, partitions: int) -> CassandraViews:
    """The views and the mailbox in Cassandra (keyspace and tables created if absent) on ONE
    session, owned by the views: their close() closes the mailbox, then the Cluster."""
    from adapters.cassandra.connect import open_session
    from adapters.cassandra.mailbox import CassandraMailbox
    from adapters.cassandra.views import CassandraViews

    connection = open_session(settings)
    try:
        mailbox = MailboxMeter(CassandraMailbox(connection.session, settings.keyspace))  # timed: ADR-0026
        return CassandraViews(connection.session, settings.keyspace, mailbox, partitions=partitions,
                              in_flight=settings.in_flight, connection=connection)  # fmt: skip
    except BaseException:
        connection.close()
        raise


def bootstrap_distributed(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    views: ViewStore | None = None,
) -> DistributedRuntime:
    """An API replica of the distributed runtime: the command side on the PostgreSQL event
    store (tables created if absent), the views in Cassandra (keyspace and tables created if
    absent), pushes and health from Kafka. The relay and the workers run apart
    (`fanout relay`, `fanout worker`)."""
    from fanout.event_store import check_event_store

    kafka = kafka_settings(settings.log)
    env = postgres_env(settings.event_store)
    check_event_store(env)  # a missing database or a server down: one line naming the URL and what to do
    built = None
    if views is None:
        cassandra = cassandra_settings(settings.views)
        try:
            views = built = open_cassandra_views(cassandra, partitions=kafka.partitions)
        except Exception as exc:
            where = f"cassandra://{','.join(cassandra.hosts)}:{cassandra.port}/{cassandra.keyspace}"
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise EngineUnavailable(
                f"FANOUT_VIEWS: cannot open the views at {where} ({type(exc).__name__}: {first}): is Cassandra "
                "running there?"
            ) from None
    try:
        return DistributedRuntime(
            settings.params,
            env,
            views,
            KafkaEngines(kafka),
            partitions=kafka.partitions,
            route=conversation_partition,
            clock=clock,
        )
    except BaseException:
        if built is not None:
            built.close()
        raise


# -- the stores of the settings' engines, for the operator tools --------------------------


def open_application_for(settings: Settings, data_dir: Path | str | None = None, **wiring: Any) -> FanoutApplication:
    """The command side over the event store the settings name, an existing one only
    (no table is created): PostgreSQL for FANOUT_EVENT_STORE=postgresql://..., else the
    SQLite store of the data dir (the tools that read the log: `fanout replay`)."""
    if is_distributed(settings):
        env = postgres_env(settings.event_store)
        env["CREATE_TABLE"] = "n"
        return FanoutApplication(settings.params, env, **wiring)
    return open_application(settings.params, settings.data_dir if data_dir is None else data_dir,
                            create_tables=False, **wiring)  # fmt: skip


def log_partitions(settings: Settings) -> int:
    """The partition count of the event topic (FANOUT_LOG): how many positions the views
    track per projection, and how many capacity states they hold."""
    return kafka_settings(settings.log).partitions


def open_distributed_views(settings: Settings, *, keyspace: str | None = None) -> CassandraViews:
    """The Cassandra views (and mailbox) of FANOUT_VIEWS, or of another keyspace on the same
    cluster (`keyspace`: views built aside by `fanout rebuild` / `verify`); the keyspace and
    its tables are created if absent."""
    from dataclasses import replace

    cassandra = cassandra_settings(settings.views)
    if keyspace is not None:
        cassandra = replace(cassandra, keyspace=keyspace)
    return open_cassandra_views(cassandra, partitions=log_partitions(settings))


def cassandra_aside_builds(views: CassandraViews) -> CassandraAsideBuilds:
    """The Cassandra side of `fanout rebuild` / `verify` over the live views' session."""
    from adapters.cassandra.rebuild import CassandraAsideBuilds

    return CassandraAsideBuilds(views.session, views.keyspace)


def worker_group_members(settings: Settings) -> int:
    """Processes in the projection workers' consumer group of FANOUT_LOG's topic (0: none):
    what `fanout rebuild` asks before it merges (a member may still write, heartbeat or not)."""
    from streams.worker import WorkerSettings

    kafka = kafka_settings(settings.log)
    return consumer_group_members(kafka.bootstrap, WorkerSettings(kafka.bootstrap, kafka.topic).group)
