"""SQLite's errors as the port errors (projections/errors.py), translated at the boundary of
every SQLite store of a data dir: the views (views.py), the SQLite mailbox (mailbox.py),
the rebuild's file surgery (rebuild.py) and the embedded event store (event_store.py).

`sqlite_boundary` is the class decorator those stores carry; a unit of work translates
in its own `except` with `storage_error`."""

from __future__ import annotations

import sqlite3

from projections.errors import StorageError, StorageFull, StorageIOError, storage_boundary

SQLITE_FULL = 13
SQLITE_IOERR = 10
# The store failing rather than the request being wrong: a full disk, an I/O error, a file it
# cannot open or write, a database another process holds locked, a file that is no database.
# The request's own errors (a constraint, a closed connection, a bad parameter) are left as
# they are: bugs to see (and eventsourcing's IntegrityError is a lost race it handles).
STORE_ERRORS = (sqlite3.OperationalError, sqlite3.InternalError)


def storage_error(exc: sqlite3.Error) -> StorageError | None:
    """The port error of a SQLite error, None for the request's own errors."""
    if not isinstance(exc, STORE_ERRORS) and type(exc) is not sqlite3.DatabaseError:
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc)
    if primary == SQLITE_FULL or "database or disk is full" in text:
        return StorageFull(text)
    if primary == SQLITE_IOERR or "disk I/O error" in text:
        return StorageIOError(text)
    return StorageError(text)


def _translate(exc: BaseException) -> StorageError | None:
    return storage_error(exc) if isinstance(exc, sqlite3.Error) else None


sqlite_boundary = storage_boundary((sqlite3.Error,), _translate, also=("__init__",))  # opening too
