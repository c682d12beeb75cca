"""The stores the operator tools open (`fanout rebuild`, `verify`, `replay`, `analyze`), on
the engines the settings name, and the projection host they rebuild with: the tools say
what they need, this module picks the engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.sqlite.rebuild import SqliteAsideBuilds
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap.embedded import open_application
from fanout.bootstrap.replica import open_cassandra_views
from fanout.config import Settings, is_distributed
from fanout.urls import cassandra_settings, kafka_settings, postgres_env
from projections.ports import ALL_TARGETS, AsideBuilds, ViewStore
from streams.embedded import EmbeddedRunner

if TYPE_CHECKING:
    from adapters.cassandra.rebuild import CassandraAsideBuilds
    from adapters.cassandra.views import CassandraViews


def rebuild_host(
    app: FanoutApplication,
    views: ViewStore,
    params: Parameters,
    *,
    targets: frozenset[str] = ALL_TARGETS,
    until: int | None = None,
) -> EmbeddedRunner:
    """The projection host a rebuild runs: the event store's notification log (up to `until`)
    into `views`, the projections of `targets` only, on any engine."""
    return EmbeddedRunner(app, views, params, targets=targets, until=until)


def sqlite_aside_builds() -> AsideBuilds:
    """Views built aside in a data dir (files with a prefix) and swapped in by rename."""
    return SqliteAsideBuilds()


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
    from streams.kafka import consumer_group_members
    from streams.worker import WorkerSettings

    kafka = kafka_settings(settings.log)
    return consumer_group_members(kafka.brokers, WorkerSettings(kafka.brokers, kafka.topic).group)
