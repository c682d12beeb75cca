"""The embedded runtime's event store: eventsourcing's SQLite recorders with SQLite's errors
raised as the port errors (errors.py), as every other store of a data dir raises them. The
library wraps each sqlite3 error in its own (its IntegrityError is a lost race the command
side retries, left as it is); a full disk or an I/O error under one becomes StorageFull or
StorageIOError. The composition root names `SqliteEventStoreFactory` in the event store's
environment (fanout/bootstrap/embedded.py `sqlite_event_store`)."""

from __future__ import annotations

import sqlite3

from eventsourcing.persistence import PersistenceError
from eventsourcing.sqlite import SQLiteAggregateRecorder, SQLiteApplicationRecorder, SQLiteFactory

from adapters.sqlite.errors import storage_error
from projections.errors import StorageError, storage_boundary


def _translate(exc: BaseException) -> StorageError | None:
    driver = exc if isinstance(exc, sqlite3.Error) else exc.__cause__  # the library's, or under it
    return storage_error(driver) if isinstance(driver, sqlite3.Error) else None


event_store_boundary = storage_boundary((PersistenceError, sqlite3.Error), _translate)


@event_store_boundary
class SqliteEventRecorder(SQLiteApplicationRecorder):
    """The events (eventsourcing's application recorder)."""


@event_store_boundary
class SqliteSnapshotRecorder(SQLiteAggregateRecorder):
    """The snapshots (eventsourcing's aggregate recorder)."""


class SqliteEventStoreFactory(SQLiteFactory):
    """eventsourcing's SQLite factory with the recorders above: an environment whose
    PERSISTENCE_MODULE is this class's topic opens it."""

    aggregate_recorder_class = SqliteSnapshotRecorder
    application_recorder_class = SqliteEventRecorder
