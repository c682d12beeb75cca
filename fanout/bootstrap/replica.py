"""An API replica of the distributed runtime: the command side on the PostgreSQL event store,
the views and the mailbox in Cassandra (written by the workers), pushes, heartbeats and the
relay's position from Kafka (`streams/replica_links.py`). Also the Cassandra views every
other process of that runtime opens (`open_cassandra_views`: the workers, the tools)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap.event_store import postgres_event_store
from fanout.clock_guard import ClockGuard
from fanout.config import EngineUnavailable, Settings
from fanout.distributed import DistributedRuntime, ReplicaLinks, ViewsProgress
from fanout.effects import Effects, push_online
from fanout.overload import Backpressure
from fanout.push import PushHub
from fanout.queries import Queries
from fanout.runtime import ViewReads
from fanout.urls import CassandraSettings, cassandra_settings, kafka_settings
from projections.delivery import Delivered, DeliveryProjection
from projections.failures import first_line
from projections.head_cache import HeadCache
from projections.ports import MailboxTimer, StoreLayoutError, ViewStore
from streams.routing import conversation_partition

if TYPE_CHECKING:  # the engines' clients are imported when the runtime is built
    from adapters.cassandra.views import CassandraViews


def open_cassandra_views(
    settings: CassandraSettings,
    *,
    partitions: int,
    timer: MailboxTimer | None = None,
    head_cache: HeadCache | None = None,
) -> CassandraViews:
    """The views and the mailbox in Cassandra (keyspace and tables created if absent) on ONE
    session, owned by the views: their close() closes the mailbox, then the Cluster. `timer`:
    told the mailbox layer's write times (a worker's MailboxMeter, ADR-0026); `head_cache`: the
    heads an API replica keeps for its logins (ADR-0035)."""
    from adapters.cassandra.connect import open_session
    from adapters.cassandra.mailbox import CassandraMailbox
    from adapters.cassandra.views import CassandraViews

    connection = open_session(settings)
    try:
        mailbox = CassandraMailbox(connection.session, settings.keyspace)
        return CassandraViews(connection.session, settings.keyspace, mailbox, partitions=partitions,
                              in_flight=settings.in_flight, connection=connection, timer=timer,
                              head_cache=head_cache)  # fmt: skip
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
    from adapters.postgres.connect import EventStoreUnavailable, check_event_store
    from streams.replica_links import KafkaReplicaLinks  # Kafka's client: when this runtime is built

    kafka = kafka_settings(settings.log)
    env = postgres_event_store(settings.event_store)
    try:
        check_event_store(env)  # a missing database or a server down: one line naming the URL and what to do
    except EventStoreUnavailable as exc:
        raise EngineUnavailable(str(exc)) from None
    built = None
    head_cache = None
    if views is None:
        cassandra = cassandra_settings(settings.views)
        try:
            if cassandra.head_cache > 0:  # ADR-0035: the heads the logins read, kept while the workers say they hold
                head_cache = HeadCache(kafka.partitions, capacity=cassandra.head_cache)
            views = built = open_cassandra_views(cassandra, partitions=kafka.partitions, head_cache=head_cache)
        except StoreLayoutError:
            raise  # Cassandra is there; its keyspace is of another layout: the error says what to do
        except Exception as exc:
            where = f"cassandra://{','.join(cassandra.hosts)}:{cassandra.port}/{cassandra.keyspace}"
            raise EngineUnavailable(
                f"FANOUT_VIEWS: cannot open the views at {where} ({type(exc).__name__}: {first_line(str(exc))}): "
                "is Cassandra running there?"
            ) from None
    try:
        return replica_runtime(
            settings.params,
            env,
            views,
            KafkaReplicaLinks(kafka, unreachable=EngineUnavailable),
            partitions=kafka.partitions,
            clock=clock,
            head_cache=head_cache,
        )
    except BaseException as exc:
        if built is not None:
            built.close()
        if isinstance(exc, EventStoreUnavailable):  # another process's table creation never ended
            raise EngineUnavailable(str(exc)) from None
        raise


def replica_runtime(
    params: Parameters,
    event_store_env: Mapping[str, str],
    views: ViewStore,
    links: ReplicaLinks,
    *,
    partitions: int,
    clock: Callable[[], float],
    head_cache: HeadCache | None,
) -> DistributedRuntime:
    """An API replica's parts over engines already open: the command side on the shared
    store reading the views (ViewReads), the push hub fed by the workers' `Delivered` (this
    replica's sockets), the backpressure with the clock guard that holds this replica's clock
    to PostgreSQL's (ADR-0041), the views' progress they both read."""
    from adapters.postgres.event_store import database_clock

    runtime: DistributedRuntime  # the reads wait on its watchers, built once the application is

    def projected() -> None:  # what a tier decision waits for: the log written so far in the views
        runtime.wait_until(runtime.log_position(), timeout=30)

    progress = ViewsProgress(views.views_position(DeliveryProjection.name))
    reads = ViewReads(views, position=lambda: progress.committed, catch_up=projected)
    app = FanoutApplication(params, dict(event_store_env), clock=clock, shared_store=True, **reads.wiring())
    try:
        clock_guard = None
        if params.max_clock_skew > 0:
            recorder = app.recorder
            clock_guard = ClockGuard(lambda: database_clock(recorder), clock, params.max_clock_skew)
        backpressure = Backpressure(
            progress,
            app.log_position(),
            max_events=params.max_projection_lag_events,
            max_entries=params.max_projection_lag_entries,
            gates=[clock_guard.check] if clock_guard is not None else [],
        )
        app.recorded_listeners.append(backpressure.recorded)
        hub = PushHub(views)
        runtime = DistributedRuntime(
            params,
            views,
            links,
            app,
            progress=progress,
            queries=Queries(views, params),
            hub=hub,
            backpressure=backpressure,
            effects=Effects({Delivered: [push_online(hub, views)]}),  # a Delivered the workers published
            partitions=partitions,
            route=conversation_partition,
            head_cache=head_cache,
            clock_guard=clock_guard,
        )
        return runtime
    except BaseException:
        app.close()
        raise
