"""The stores the operator tools open (`fanout rebuild`, `verify`, `replay`, `analyze`), on
the engines the settings name, and the projection host they rebuild with: the tools say
what they need, this module picks the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.sqlite.connect import VIEWS_FILE
from adapters.sqlite.rebuild import SqliteAsideBuilds
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap.embedded import bootstrap, open_application, open_views, open_views_only, sqlite_event_store
from fanout.bootstrap.event_store import postgres_event_store
from fanout.bootstrap.replica import open_cassandra_views
from fanout.config import ConfigError, EngineUnavailable, Settings, is_distributed
from fanout.urls import cassandra_settings, kafka_settings
from projections.capacity import CapacityProjection
from projections.capacity_monitor import platform_window
from projections.failures import first_line
from projections.ports import ALL_TARGETS, AsideBuilds, StoreLayoutError, ViewStore
from streams.embedded import EmbeddedRunner

if TYPE_CHECKING:
    from adapters.cassandra.views import CassandraViews

Progress = Callable[[int], None]  # the live views' position, as they catch up


@dataclass
class RebuildSite:
    """What `fanout rebuild` and `verify` (tools/rebuild.py) work on, on the engines the
    settings name: the log, the live views with the views built aside (`aside`), and the
    two steps that differ between the runtimes, injected:

    * `catch_up_live(progress)`: bring the live views to the end of the log. Embedded: the
      tool projects it in process (it holds the data dir's lock, so no serve runs); distributed:
      None, the workers do it and the tool waits for one position.
    * `writers()`: who else may be writing the live views right now ("" for no one): the
      embedded data dir is locked; on Cassandra, the members of the workers' consumer group."""

    app: FanoutApplication
    params: Parameters
    aside: AsideBuilds
    partitions: int  # the log partitions the views track positions of
    catch_up_live: Callable[[Progress | None], None] | None
    writers: Callable[[], str]
    close: Callable[[], None]

    def host(self, views: ViewStore, targets: frozenset[str], until: int) -> EmbeddedRunner:
        return rebuild_host(self.app, views, self.params, targets=targets, until=until)


def open_rebuild_site(settings: Settings) -> RebuildSite:
    """The site of the engines the settings name. Embedded: the data dir must hold an
    event store (ConfigError), and it is locked (DataDirBusy while `fanout serve` runs)."""
    if is_distributed(settings):
        return _cassandra_site(settings)
    data_dir = Path(settings.data_dir)
    store = Path(sqlite_event_store(data_dir)["SQLITE_DBNAME"])
    if not store.exists():
        raise ConfigError(f"{data_dir} has no event store ({store.name}): nothing to rebuild or verify from")
    rt = bootstrap(settings, lock=True)
    runner = rt.runner

    def catch_up_live(progress: Progress | None) -> None:
        runner.catch_up((lambda _n: progress(runner.position())) if progress else None)

    try:
        aside = SqliteAsideBuilds(
            data_dir, rt.views, lambda prefix: open_views(data_dir, settings.params.mailbox_shards, prefix=prefix)
        )
    except BaseException:
        rt.close()
        raise

    def close() -> None:
        try:
            aside.close()
        finally:
            rt.close()

    return RebuildSite(rt.app, settings.params, aside, 1, catch_up_live, lambda: "", close)


def _cassandra_site(settings: Settings) -> RebuildSite:
    from adapters.cassandra.rebuild import CassandraAsideBuilds

    live = open_distributed_views(settings)  # first: a keyspace of an old layout is refused before the log is read
    try:
        app = open_application_for(settings)
    except BaseException:
        live.close()
        raise
    aside = CassandraAsideBuilds(
        live.session, live.keyspace, lambda keyspace: open_distributed_views(settings, keyspace=keyspace)
    )

    def writers() -> str:
        n = worker_group_members(settings)
        return f"{n} `fanout worker` process(es) are in the consumer group" if n else ""

    def close() -> None:
        try:
            aside.close()
            live.close()
        finally:
            app.close()

    return RebuildSite(app, settings.params, aside, log_partitions(settings), None, writers, close)


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


class NoStore(ConfigError):
    """The data dir the settings name holds no such store (nothing was written there yet)."""


def open_application_for(settings: Settings, data_dir: Path | str | None = None, **wiring: Any) -> FanoutApplication:
    """The command side over the event store the settings name, an existing one only
    (no table is created): PostgreSQL for FANOUT_EVENT_STORE=postgresql://..., else the
    SQLite store of the data dir (the tools that read the log: `fanout replay`; NoStore when
    the data dir has none)."""
    if is_distributed(settings):
        env = postgres_event_store(settings.event_store)
        env["CREATE_TABLE"] = "n"
        app = None
        try:
            app = FanoutApplication(settings.params, env, **wiring)
            app.recorder.max_notification_id()  # the tables exist (none is created here)
        except Exception as exc:
            if app is not None:
                app.close()
            raise EngineUnavailable(
                f"cannot read the event store of FANOUT_EVENT_STORE: {type(exc).__name__}: {first_line(exc)}"
            ) from None
        return app
    where = Path(settings.data_dir if data_dir is None else data_dir)
    store = Path(sqlite_event_store(where)["SQLITE_DBNAME"])
    if not store.exists():
        raise NoStore(f"{where} has no event store ({store.name})")
    return open_application(settings.params, where, create_tables=False, **wiring)


def open_views_to_read(settings: Settings) -> ViewStore:
    """The views a tool reads beside the running processes (`fanout analyze`): the Cassandra
    views of FANOUT_VIEWS, or the data dir's SQLite views without their mailbox store (a
    running `serve` holds RocksDB's lock; NoStore when the data dir has no views)."""
    if is_distributed(settings):
        try:
            return open_distributed_views(settings)
        except StoreLayoutError:
            raise  # Cassandra is there; its keyspace is of another layout: the error says what to do
        except Exception as exc:
            raise EngineUnavailable(f"cannot open the views of FANOUT_VIEWS: {type(exc).__name__}: {exc}") from None
    return open_views_only(_sqlite_views_of(settings))


def open_lookup_views(settings: Settings) -> ViewStore | None:
    """The views `fanout replay` may look a conversation's key up in, when it is cheap: the
    data dir's SQLite views read-only (not even a schema migration written) when it has
    them; None on the distributed runtime (the keys come from the log and the aggregates,
    no Cassandra session) or when they cannot be opened."""
    if is_distributed(settings):
        return None
    try:
        return open_views_only(_sqlite_views_of(settings), readonly=True)
    except Exception:  # no views, or views we cannot open: the keys come from the log
        return None


def _sqlite_views_of(settings: Settings) -> Path:
    data_dir = Path(settings.data_dir)
    if not (data_dir / VIEWS_FILE).exists():
        raise NoStore(f"{data_dir} has no views ({VIEWS_FILE})")
    return data_dir


def capacity_window(settings: Settings, views: ViewStore) -> CapacityProjection:
    """The capacity window the views hold (T1/T2, ADR-0020): the one state of the embedded
    runtime, or on the distributed one every log partition's merged."""
    if is_distributed(settings):
        return platform_window(settings.params, views, log_partitions(settings))
    return CapacityProjection(settings.params, state=views.capacity_state(CapacityProjection.name))


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


def worker_group_members(settings: Settings) -> int:
    """Processes in the projection workers' consumer group of FANOUT_LOG's topic (0: none):
    what `fanout rebuild` asks before it merges (a member may still write, heartbeat or not)."""
    from streams.kafka import consumer_group_members
    from streams.worker import worker_group

    kafka = kafka_settings(settings.log)
    return consumer_group_members(kafka.brokers, worker_group(kafka.topic))
