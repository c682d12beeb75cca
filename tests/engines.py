"""The real engines for the tests of the distributed runtime (PostgreSQL, Kafka, Cassandra).

`engines` (session) uses the engines named in $FANOUT_ENGINES_DIR/engines.env when they
answer (a developer ran `make engines-up`); otherwise it starts them the way FANOUT_ENGINES
selects (local: infra/engines/up.sh, testcontainers: Docker) and stops them at the end.
An engine that cannot start FAILS the tests that need it, with the cause: never a skip.

Each test gets its own namespace on the shared engines, so tests never see each other's
data: a fresh PostgreSQL database, Kafka topic and Cassandra keyspace (`fresh_*`)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
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


class Keyspaces:
    """Keyspaces handed to one test at a time and, once given back, emptied and handed again.

    Creating a keyspace's 22 tables takes 3-8 s on this machine and dropping it 2-9 s (each
    schema change is applied by Cassandra one at a time); TRUNCATE of every table takes
    0.1-0.5 s. A keyspace comes back to the pool only when its tables are a subset of the
    current schema's, column for column (the views create what is missing, IF NOT EXISTS);
    anything else (a test's old mailbox layout, a table of its own) is dropped. A test that
    must see no keyspace at all takes `new_cassandra`."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.free: list[str] = []
        self._session: Any = None
        self._reference: set[tuple[str, str, str, str]] | None = None
        self._lock = threading.RLock()  # the e2e namespaces take and give back from a thread of their own

    def _columns(self, keyspace: str) -> set[tuple[str, str, str, str]]:
        rows = self.session().execute(
            "SELECT table_name, column_name, kind, type FROM system_schema.columns WHERE keyspace_name=%s",
            (keyspace,),
        )
        return {(r[0], r[1], r[2], r[3]) if not isinstance(r, dict) else tuple(r.values()) for r in rows}

    def session(self) -> Any:
        with self._lock:
            return self._open_session()

    def _open_session(self) -> Any:
        if self._session is None:
            from cassandra.cluster import Cluster

            from fanout.urls import cassandra_settings

            c = cassandra_settings(self.base_url)
            self._session = Cluster(list(c.hosts), port=c.port, protocol_version=5).connect()
        return self._session

    def reference(self) -> set[tuple[str, str, str, str]]:
        """The columns of the current schema, from a keyspace made with it once a session."""
        with self._lock:
            return self._reference_columns()

    def _reference_columns(self) -> set[tuple[str, str, str, str]]:
        if self._reference is None:
            from adapters.cassandra.schema import ALL_TABLES, create_schema

            keyspace = unique("ref")
            create_schema(self.session(), keyspace, 1, "", ALL_TABLES)
            self._reference = self._columns(keyspace)
            self.session().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        return self._reference

    def take(self) -> str:
        return with_path(self.base_url, self.free.pop() if self.free else unique("t"))

    def give_back(self, url: str) -> None:
        from fanout.urls import cassandra_settings

        keyspace = cassandra_settings(url).keyspace
        try:
            columns = self._columns(keyspace)
            if columns and not columns <= self.reference():
                raise ValueError("not the current schema")
            tables = sorted({t for t, *_ in columns})
            for f in [self.session().execute_async(f"TRUNCATE {keyspace}.{t}", timeout=120) for t in tables]:
                f.result()
        except Exception:
            drop_keyspace(url)
        else:
            self.free.append(keyspace)

    def close(self) -> None:
        for keyspace in self.free:
            with contextlib.suppress(Exception):
                self.session().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        if self._session is not None:
            self._session.cluster.shutdown()


@pytest.fixture(scope="session")
def keyspaces(engines: dict[str, str]) -> Iterator[Keyspaces]:
    pool = Keyspaces(engines["FANOUT_VIEWS"])
    yield pool
    pool.close()


@pytest.fixture
def fresh_cassandra(keyspaces: Keyspaces) -> Iterator[str]:
    """A cassandra:// URL naming a keyspace no other test is using, empty (its tables may
    exist: `Keyspaces`); emptied or dropped afterwards."""
    url = keyspaces.take()
    yield url
    keyspaces.give_back(url)


@pytest.fixture
def new_cassandra(engines: dict[str, str]) -> Iterator[str]:
    """A cassandra:// URL naming a keyspace that does not exist; dropped afterwards."""
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
