"""The PostgreSQL event store as every process of the distributed runtime opens it
(docs/adr/0022-schema-creation-under-an-advisory-lock.md).

* `SchemaLockedFactory`: eventsourcing's PostgreSQL factory whose recorders (the events:
  `SchemaLockedRecorder`, the snapshots: `SchemaLockedAggregateRecorder`) run `create_table`
  under a PostgreSQL advisory lock of the database, so any number of workers, relays and
  replicas starting at once create the tables, the composite type, the index and the
  stored function one at a time. eventsourcing's own statements race: two sessions creating
  the type or the table fail with `duplicate key value violates unique constraint
  "pg_type_typname_nsp_index"` (or `relation ... already exists`), and two restarts
  recreating the function (CREATE OR REPLACE, on every start) with `tuple concurrently
  updated`. A creator that does not take the lock (an older build) can still race one that
  does: those catalog errors are retried a few times as well.
  `FanoutApplication` uses this factory for every eventsourcing.postgres environment.
* `check_event_store`: a plain connection before the pool opens, so a missing database,
  a server that does not answer or a refused login is one line naming the URL (without
  its password) and what to do, not eventsourcing's "couldn't get a connection after
  5.00 sec".
* `database_clock`: the server's time, which the API replicas measure their clocks against
  (ADR-0041).
* `binary_insert`: the recorders' INSERT sends its array of stored events in psycopg's
  binary format (ADR-0037): the library's statement lets psycopg pick the text format, whose
  composite dumper escapes every field (the state's bytea too) with regular expressions:
  65 us an event against 7.7 us in binary, measured (ADR-0037)."""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
    PostgresRecorder,
)
from psycopg.sql import SQL, Composed

from fanout.config import EngineUnavailable

log = logging.getLogger("fanout.event_store")

LOCK_TIMEOUT = 60.0  # seconds a process waits for another one's schema creation
CATALOG_RETRIES = 5  # attempts when a creator without the lock raced this one
# SQLSTATEs of a concurrent creator: unique_violation (pg_type_typname_nsp_index),
# internal_error ("tuple concurrently updated"), duplicate_table, duplicate_object.
CATALOG_RACE = {"23505", "XX000", "42P07", "42710"}


class EventStoreUnavailable(EngineUnavailable):
    """The event store cannot be opened for a reason the operator can fix: one line."""


def lock_key(schema: str) -> int:
    """The advisory lock key (a signed 64-bit int) of the event store's schema objects in a
    schema. Advisory locks are per database, so namespaces in other databases never wait."""
    digest = hashlib.blake2b(f"fanout.event_store.schema:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextmanager
def advisory_lock(datastore: PostgresDatastore, key: int, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """A session-level advisory lock on a connection of the pool, held for the block and
    released before the connection goes back (a process that dies releases it too)."""
    deadline = time.monotonic() + timeout
    with datastore.get_connection() as conn:  # autocommit: the lock belongs to the session
        waited = False
        while True:
            row: Any = conn.execute("SELECT pg_try_advisory_lock(%s) AS locked", (key,)).fetchone()
            if row["locked"]:
                break
            if time.monotonic() >= deadline:
                raise EventStoreUnavailable(
                    f"another process has been creating the event store's tables for {timeout:.0f} s "
                    f"(advisory lock {key} held): is it stuck?"
                )
            if not waited:
                log.debug("waiting for another process creating the event store's tables")
                waited = True
            time.sleep(random.uniform(0.02, 0.06))  # noqa: S311 (jitter, not crypto)
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def database_clock(recorder: Any) -> float:
    """The PostgreSQL server's time (seconds since the epoch, `clock_timestamp()`: now, not the
    transaction's start) on a connection of the recorder's pool: the one clock every replica
    shares, which each measures its own against (fanout/clock_guard.py, ADR-0041)."""
    datastore: PostgresDatastore = recorder.datastore
    with datastore.get_connection() as conn:
        row: Any = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS now").fetchone()
        return float(row["now"])


def _sqlstate(exc: BaseException) -> str | None:
    seen: BaseException | None = exc
    while seen is not None:
        state = getattr(seen, "sqlstate", None)
        if state:
            return str(state)
        seen = seen.__cause__ or seen.__context__
    return None


TEXT_ARRAY = "unnest(%s::"  # the placeholder of eventsourcing's insert of stored events
BINARY_ARRAY = "unnest(%b::"


def binary_insert(statement: Composed) -> Composed:
    """eventsourcing's insert with its array of stored events dumped in binary (`%b`): the
    same statement otherwise. A statement of another shape (a newer library) is kept as it
    is: the text format is slower, never wrong."""
    text = statement.as_string(None)
    if text.count(TEXT_ARRAY) != 1:
        log.debug("the event store's insert has an unexpected shape; its text format is kept")
        return statement
    return Composed([SQL(text.replace(TEXT_ARRAY, BINARY_ARRAY))])


class SchemaLocked(PostgresRecorder):
    """A recorder creating its schema objects under the database's advisory lock for them
    (see the module doc). One key for all of them: the events and the snapshots tables
    share their composite type. Its insert sends the stored events in binary."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self, PostgresAggregateRecorder):  # the events' and the snapshots' recorders
            recorder: PostgresAggregateRecorder = self
            recorder.insert_events_statement = binary_insert(recorder.insert_events_statement)

    def create_table(self) -> None:
        key = lock_key(self.datastore.schema)
        for attempt in range(1, CATALOG_RETRIES + 1):
            try:
                with advisory_lock(self.datastore, key):
                    super().create_table()
                return
            except EventStoreUnavailable:
                raise
            except Exception as exc:
                if _sqlstate(exc) not in CATALOG_RACE or attempt == CATALOG_RETRIES:
                    raise
                log.info("creating the event store's tables raced another creator (%s); again", exc)
                time.sleep(random.uniform(0.05, 0.2) * attempt)  # noqa: S311 (jitter, not crypto)


class SchemaLockedRecorder(SchemaLocked, PostgresApplicationRecorder):
    """The events (eventsourcing's application recorder)."""


class SchemaLockedAggregateRecorder(SchemaLocked, PostgresAggregateRecorder):
    """The snapshots (eventsourcing's aggregate recorder)."""


class SchemaLockedFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory with the recorders above; `FanoutApplication`
    uses it for every eventsourcing.postgres environment."""

    aggregate_recorder_class = SchemaLockedAggregateRecorder
    application_recorder_class = SchemaLockedRecorder


# -- opening it ----------------------------------------------------------------------------


def safe_url(env: Mapping[str, str]) -> str:
    """The store's URL from eventsourcing's environment, without the password."""
    return (
        f"postgresql://{env.get('POSTGRES_USER', 'postgres')}@{env.get('POSTGRES_HOST', '?')}:"
        f"{env.get('POSTGRES_PORT', '5432')}/{env.get('POSTGRES_DBNAME', '?')}"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # psycopg: 'connection failed: connection to server at "h", port p failed: FATAL:  database ...'
    if "FATAL:" in text:
        text = text.split("FATAL:", 1)[1]
    text = text.removeprefix("connection failed: ")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[0].split()) if lines else type(exc).__name__


def unavailable_message(env: Mapping[str, str], exc: BaseException, setting: str = "FANOUT_EVENT_STORE") -> str:
    """One line for a connection the store refused or never answered, with what to do."""
    url, db = safe_url(env), env.get("POSTGRES_DBNAME", "?")
    host, port, user = env.get("POSTGRES_HOST", "?"), env.get("POSTGRES_PORT", "5432"), env.get("POSTGRES_USER", "?")
    state, what = _sqlstate(exc), _first_line(exc)
    lowered = what.lower()
    if state == "3D000" or ("database" in lowered and "does not exist" in lowered):
        return (
            f"{setting}: the database {db!r} does not exist at {url}: create it "
            f"(createdb -h {host} -p {port} -U {user} {db}) or name an existing one in {setting}"
        )
    if state in ("28P01", "28000") or "authentication" in lowered or "no pg_hba.conf entry" in lowered:
        return f"{setting}: PostgreSQL at {url} refused the login ({what}): check the user and password in {setting}"
    if "refused" in lowered or "timeout" in lowered or "timed out" in lowered or "could not translate" in lowered:
        return (
            f"{setting}: PostgreSQL at {url} does not answer ({what}): start it, "
            f"or name the right host and port in {setting}"
        )
    return f"{setting}: cannot connect to PostgreSQL at {url}: {what}"


def check_event_store(env: Mapping[str, str], setting: str = "FANOUT_EVENT_STORE") -> None:
    """Connect once, plainly; EventStoreUnavailable (one line, with what to do) when the
    store cannot be reached or opened."""
    import psycopg

    try:
        conn = psycopg.connect(
            host=env["POSTGRES_HOST"],
            port=int(env.get("POSTGRES_PORT", "5432")),
            user=env["POSTGRES_USER"],
            password=env.get("POSTGRES_PASSWORD") or None,
            dbname=env["POSTGRES_DBNAME"],
            connect_timeout=int(env.get("POSTGRES_CONNECT_TIMEOUT") or "5"),
        )
    except psycopg.Error as exc:
        raise EventStoreUnavailable(unavailable_message(env, exc, setting)) from None
    conn.close()
