"""The real engines for the tests of the distributed runtime (PostgreSQL, Kafka, Cassandra).

`engines` (session) uses the engines named in $FANOUT_ENGINES_DIR/engines.env when they
answer (a developer ran `make engines-up`); otherwise it starts them the way FANOUT_ENGINES
selects (local: infra/engines/up.sh, testcontainers: Docker) and stops them at the end.
An engine that cannot start FAILS the tests that need it, with the cause: never a skip.

Each test gets its own namespace on the shared engines, so tests never see each other's
data: a fresh PostgreSQL database, Kafka topic and Cassandra keyspace (`fresh_*`)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRESH_PARTITIONS = 4  # the partitions of a fresh_kafka topic
sys.path.insert(0, str(ROOT / "infra" / "testcontainers"))
import engines as infra_engines  # noqa: E402  (infra/testcontainers/engines.py)

sys.path.pop(0)


@pytest.fixture(scope="session")
def engines() -> Iterator[dict[str, str]]:
    """FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS of running engines."""
    if os.environ.get("FANOUT_TESTS_WITHOUT_ENGINES"):
        pytest.fail(
            "a test reached the engines in a run without them (make test-fast): mark it `engines` "
            "(tests/conftest.py gives the marker to the tests whose fixtures name `engines`)",
            pytrace=False,
        )
    with ExitStack() as stack:
        try:
            urls = stack.enter_context(infra_engines.engines_in_use())
        except infra_engines.EngineStartError as exc:
            pytest.fail(f"the engines of the distributed runtime did not start: {exc}", pytrace=False)
        yield urls


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def with_query(url: str, **params: object) -> str:
    u = urlsplit(url)
    q = "&".join([*(p for p in u.query.split("&") if p), *(f"{k}={v}" for k, v in params.items())])
    return urlunsplit((u.scheme, u.netloc, u.path, q, ""))


def with_path(url: str, path: str) -> str:
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, "/" + path, u.query, ""))


@pytest.fixture
def fresh_postgres(engines: dict[str, str]) -> Iterator[str]:
    """A new, empty PostgreSQL database on the shared server; dropped afterwards."""
    import psycopg

    base = engines["FANOUT_EVENT_STORE"]
    name = unique("t")
    admin = with_path(base, "postgres").replace("postgresql://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_path(base, name)
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_kafka(engines: dict[str, str]) -> str:
    """A kafka:// URL naming a topic no other test uses (created by whoever needs it)."""
    return with_query(engines["FANOUT_LOG"], topic=unique("t"), partitions=FRESH_PARTITIONS)


@pytest.fixture
def fresh_cassandra(engines: dict[str, str]) -> Iterator[str]:
    """A cassandra:// URL naming a keyspace no other test uses; dropped afterwards."""
    url = with_path(engines["FANOUT_VIEWS"], unique("t"))
    yield url
    drop_keyspace(url)


def drop_keyspace(url: str) -> None:
    from cassandra.cluster import Cluster

    from fanout.urls import cassandra_settings

    c = cassandra_settings(url)
    cluster = Cluster(list(c.hosts), port=c.port, protocol_version=5)
    try:
        session = cluster.connect()
        session.execute(f"DROP KEYSPACE IF EXISTS {c.keyspace}", timeout=60)
    finally:
        cluster.shutdown()
