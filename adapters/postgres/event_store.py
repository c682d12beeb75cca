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
  does: those catalog errors are retried a few times as well. The composition root names
  this factory in the environment of every PostgreSQL event store
  (fanout/bootstrap/event_store.py `postgres_event_store`).
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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from eventsourcing.persistence import PersistenceError
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
    PostgresRecorder,
)
from psycopg.sql import SQL, Composed

from adapters.postgres.connect import EventStoreUnavailable, sqlstate, storage_error
from projections.errors import storage_boundary

log = logging.getLogger("fanout.event_store")

LOCK_TIMEOUT = 60.0  # seconds a process waits for another one's schema creation
CATALOG_RETRIES = 5  # attempts when a creator without the lock raced this one
# SQLSTATEs of a concurrent creator: unique_violation (pg_type_typname_nsp_index),
# internal_error ("tuple concurrently updated"), duplicate_table, duplicate_object.
CATALOG_RACE = {"23505", "XX000", "42P07", "42710"}


def lock_key(schema: str) -> int:
    """The advisory lock key (a signed 64-bit int) of the event store's schema objects in a
    schema. Advisory locks are per database, so namespaces in other databases never wait.
    The text hashed is the one every release has used: processes of two releases starting
    at once wait for each other."""
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
                if sqlstate(exc) not in CATALOG_RACE or attempt == CATALOG_RETRIES:
                    raise
                log.info("creating the event store's tables raced another creator (%s); again", exc)
                time.sleep(random.uniform(0.05, 0.2) * attempt)  # noqa: S311 (jitter, not crypto)


# a full disk or an I/O error of the server raised as the port errors (connect.py storage_error)
event_store_boundary = storage_boundary((PersistenceError, psycopg.Error), storage_error)


@event_store_boundary
class SchemaLockedRecorder(SchemaLocked, PostgresApplicationRecorder):
    """The events (eventsourcing's application recorder)."""


@event_store_boundary
class SchemaLockedAggregateRecorder(SchemaLocked, PostgresAggregateRecorder):
    """The snapshots (eventsourcing's aggregate recorder)."""


class SchemaLockedFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory with the recorders above: an environment whose
    PERSISTENCE_MODULE is this class's topic opens it."""

    aggregate_recorder_class = SchemaLockedAggregateRecorder
    application_recorder_class = SchemaLockedRecorder
