"""An API replica of the distributed runtime: the command side on the PostgreSQL event store,
the views and the mailbox in Cassandra (written by the workers), pushes, heartbeats and the
relay's position from Kafka (`streams/replica_links.py`). Also the Cassandra views every
other process of that runtime opens (`open_cassandra_views`: the workers, the tools)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fanout.bootstrap.event_store import postgres_event_store
from fanout.config import EngineUnavailable, Settings
from fanout.distributed import DistributedRuntime
from fanout.urls import CassandraSettings, cassandra_settings, kafka_settings
from projections.failures import first_line
from projections.head_cache import HeadCache
from projections.ports import MailboxTimer, StoreLayoutError, ViewStore
from streams.routing import conversation_partition

if TYPE_CHECKING:  # the engines' clients are imported when the runtime is built
    from adapters.cassandra.views import CassandraViews


def open_cassandra_views(
    settings: CassandraSettings, *, partitions: int, timer: MailboxTimer | None = None
) -> CassandraViews:
    """The views and the mailbox in Cassandra (keyspace and tables created if absent) on ONE
    session, owned by the views: their close() closes the mailbox, then the Cluster. `timer`:
    told the mailbox layer's write times (a worker's MailboxMeter, ADR-0026)."""
    from adapters.cassandra.connect import open_session
    from adapters.cassandra.mailbox import CassandraMailbox
    from adapters.cassandra.views import CassandraViews

    connection = open_session(settings)
    try:
        mailbox = CassandraMailbox(connection.session, settings.keyspace)
        return CassandraViews(connection.session, settings.keyspace, mailbox, partitions=partitions,
                              in_flight=settings.in_flight, connection=connection, timer=timer)  # fmt: skip
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
    from adapters.postgres.event_store import database_clock
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
            views = built = open_cassandra_views(cassandra, partitions=kafka.partitions)
            if cassandra.head_cache > 0:  # ADR-0035: the heads the logins read, kept while the workers say they hold
                views.head_cache = head_cache = HeadCache(kafka.partitions, capacity=cassandra.head_cache)
        except StoreLayoutError:
            raise  # Cassandra is there; its keyspace is of another layout: the error says what to do
        except Exception as exc:
            where = f"cassandra://{','.join(cassandra.hosts)}:{cassandra.port}/{cassandra.keyspace}"
            raise EngineUnavailable(
                f"FANOUT_VIEWS: cannot open the views at {where} ({type(exc).__name__}: {first_line(str(exc))}): "
                "is Cassandra running there?"
            ) from None
    try:
        return DistributedRuntime(
            settings.params,
            env,
            views,
            KafkaReplicaLinks(kafka, unreachable=EngineUnavailable),
            partitions=kafka.partitions,
            route=conversation_partition,
            clock=clock,
            head_cache=head_cache,
            reference_clock=database_clock,  # this replica's clock held to PostgreSQL's (ADR-0041)
        )
    except BaseException as exc:
        if built is not None:
            built.close()
        if isinstance(exc, EventStoreUnavailable):  # another process's table creation never ended
            raise EngineUnavailable(str(exc)) from None
        raise
