"""Opening the PostgreSQL event store: a plain connection before the pool opens
(`check_event_store`), so a missing database, a server that does not answer or a refused
login is one line naming the URL (without its password) and what to do, not eventsourcing's
"couldn't get a connection after 5.00 sec"; the SQLSTATE of a driver error (`sqlstate`), and
the port error it is (`storage_error`: a full disk, an I/O error; projections/errors.py).

The settings are eventsourcing's environment for its PostgreSQL recorders (POSTGRES_HOST,
POSTGRES_PORT, POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DBNAME, ...), as the composition
root builds it from FANOUT_EVENT_STORE."""

from __future__ import annotations

from collections.abc import Mapping

from projections.errors import StorageError, StorageFull, StorageIOError
from projections.failures import first_line

DISK_FULL = "53100"
IO_ERROR = "58030"


class EventStoreUnavailable(RuntimeError):
    """The event store cannot be opened for a reason the operator can fix: one line."""


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg error, or of the error it was raised from; None if none."""
    seen: BaseException | None = exc
    while seen is not None:
        state = getattr(seen, "sqlstate", None)
        if state:
            return str(state)
        seen = seen.__cause__ or seen.__context__
    return None


def storage_error(exc: BaseException) -> StorageError | None:
    """The port error of a psycopg error (or eventsourcing's wrapping one): the server out of
    disk space, or its disk failing; None for the rest (a lost connection is answered as
    before: the command fails)."""
    state = sqlstate(exc)
    text = str(exc)
    if state == DISK_FULL or "no space left on device" in text.lower():
        return StorageFull(text)
    if state == IO_ERROR:
        return StorageIOError(text)
    return None


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
    return " ".join(first_line(text.removeprefix("connection failed: ")).split()) or type(exc).__name__


def unavailable_message(env: Mapping[str, str], exc: BaseException, setting: str = "FANOUT_EVENT_STORE") -> str:
    """One line for a connection the store refused or never answered, with what to do."""
    url, db = safe_url(env), env.get("POSTGRES_DBNAME", "?")
    host, port, user = env.get("POSTGRES_HOST", "?"), env.get("POSTGRES_PORT", "5432"), env.get("POSTGRES_USER", "?")
    state, what = sqlstate(exc), _first_line(exc)
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
