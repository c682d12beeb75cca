"""The composition root (cosmicpython's `bootstrap`): the one place that picks the engines
and the projection host and wires them to the service layer, for every process kind.
The entry points (`cli/`, `tools/`, `api/`) parse their arguments and call one of these;
nothing else imports an adapter or a host (tests/unit/test_layering.py).

    embedded.py  `fanout serve` on one machine: bootstrap() (SQLite, RocksDB, in-process host)
    replica.py   an API replica of the distributed runtime: bootstrap_distributed()
    worker.py    a projection worker: bootstrap_worker()
    relay.py     the event store -> Kafka relay: bootstrap_relay()
    stores.py    the stores and the host the operator tools open (rebuild, verify, replay, analyze)
    event_store.py  the PostgreSQL event store every process of the distributed runtime opens

What a process does with the effects of a committed unit (pushes, reviews) is said by the
handlers each of these gives `fanout/effects.py`."""

from __future__ import annotations

from fanout.bootstrap.embedded import (
    EMBEDDED_ENGINES,
    DataDirBusy,
    DataDirLock,
    NoMailbox,
    ShardCountMismatch,
    bootstrap,
    open_application,
    open_mailbox,
    open_views,
    open_views_only,
    sqlite_event_store,
)
from fanout.bootstrap.event_store import postgres_event_store
from fanout.bootstrap.replica import bootstrap_distributed, open_cassandra_views
from fanout.bootstrap.stores import (
    NoStore,
    RebuildSite,
    capacity_window,
    log_partitions,
    open_application_for,
    open_distributed_views,
    open_lookup_views,
    open_rebuild_site,
    open_views_to_read,
    rebuild_host,
    worker_group_members,
)
from fanout.config import Settings, is_distributed
from fanout.runtime import Runtime
from projections.ports import StoreLayoutError

__all__ = [
    "EMBEDDED_ENGINES",
    "NoStore",
    "RebuildSite",
    "DataDirBusy",
    "DataDirLock",
    "NoMailbox",
    "ShardCountMismatch",
    "StoreLayoutError",
    "bootstrap",
    "bootstrap_distributed",
    "capacity_window",
    "log_partitions",
    "open_application",
    "open_application_for",
    "open_cassandra_views",
    "open_distributed_views",
    "open_lookup_views",
    "open_mailbox",
    "open_rebuild_site",
    "open_runtime",
    "open_views",
    "open_views_only",
    "open_views_to_read",
    "postgres_event_store",
    "rebuild_host",
    "sqlite_event_store",
    "worker_group_members",
]


def open_runtime(settings: Settings) -> Runtime:
    """The runtime the settings name: the distributed one for postgresql://, kafka:// and
    cassandra:// URLs, else the embedded one over their data dir (`fanout serve`)."""
    if is_distributed(settings):
        return bootstrap_distributed(settings)
    return bootstrap(settings)
