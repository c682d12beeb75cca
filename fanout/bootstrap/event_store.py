"""The PostgreSQL event store as every process of the distributed runtime opens it (the API
replicas, the workers, the relay, the tools): eventsourcing's environment for its PostgreSQL
recorders, parsed from FANOUT_EVENT_STORE (fanout/urls.py), whose PERSISTENCE_MODULE names
adapters/postgres's factory: its recorders create their tables under an advisory lock, so
processes starting at once do not race (ADR-0022), and insert in binary (ADR-0037). The
embedded runtime's SQLite store is `sqlite_event_store` (fanout/bootstrap/embedded.py)."""

from __future__ import annotations

from eventsourcing.utils import get_topic

from fanout.urls import postgres_env


def postgres_event_store(url: str, name: str = "FANOUT_EVENT_STORE") -> dict[str, str]:
    """eventsourcing's environment for the PostgreSQL event store at `url` (UrlError naming
    the setting `name` if malformed)."""
    from adapters.postgres.event_store import SchemaLockedFactory  # the driver: when a store is opened

    env = postgres_env(url, name)
    env["PERSISTENCE_MODULE"] = get_topic(SchemaLockedFactory)
    return env
