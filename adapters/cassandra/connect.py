"""The one place that builds the driver's Cluster and Session from the Cassandra settings
(fanout.urls.CassandraSettings): protocol 5, token-aware routing over the local
datacenter, the settings' consistency for reads and writes, rows as dicts, the request
timeout, the reconnection policy and the reactor. The views and the mailbox of a process
share one (`open_session`); the driver's log filters are installed here too.

Ownership: the caller of `open_session` owns the Connection until it hands it to a store
as `connection=`; that store's close() closes it. A store given only the session borrows
it and never shuts the Cluster down. Connection.close() shuts the Cluster down once;
closing again does nothing. The composition root (fanout/bootstrap/replica.py
`open_cassandra_views`) gives it to the views, whose close() closes the mailbox, then it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.io.asyncioreactor import AsyncioConnection
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy
from cassandra.query import dict_factory, tuple_factory

from adapters.cassandra import batches
from adapters.cassandra.schema import ALL_TABLES, create_schema

TIMEOUT = 30.0  # seconds per request
# The execution profile whose rows are plain tuples: for reads of thousands of rows (the login's
# states and heads), where a dict per row cost more client CPU than the read itself.
TUPLE_ROWS = "tuple-rows"
# The driver's default reconnection policy doubles its delay up to 600 s: after a Cassandra
# restart of ~16 s the next attempt came ~15 s after the node was back (the worker's retried
# unit and the replicas' views-position watcher waited for it; tests/distributed/test_crash.py).
RECONNECT_DELAYS = (0.5, 5.0)  # seconds: first delay, longest delay between attempts


@dataclass(frozen=True)
class ClusterSettings:
    """What opening a session reads: the fields of fanout.urls.CassandraSettings (adapters
    do not import the service layer; any object with these attributes will do)."""

    hosts: tuple[str, ...]
    port: int
    keyspace: str
    replication: int = 1
    consistency: str = "LOCAL_ONE"
    datacenter: str = "datacenter1"
    compression: str = "lz4"


class Connection:
    """One driver Cluster and its Session (ownership: the module docstring)."""

    def __init__(self, cluster: Cluster, session: Session, keyspace: str) -> None:
        self.cluster = cluster
        self.session = session
        self.keyspace = keyspace
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Shut the Cluster down (its connections and reactor threads); a second call does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.cluster.shutdown()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(settings: Any, *, tables: Sequence[str] = ALL_TABLES, reactor: str = "libev") -> Connection:
    """A Connection to the settings' cluster, with the keyspace and `tables` (DDL of
    schema.py; default: the views' and the mailbox's) created if absent. `settings`: an
    object with hosts, port, keyspace, replication, consistency, datacenter, compression
    (fanout.urls.CassandraSettings, ClusterSettings). The caller owns what it returns."""
    cluster, session = open_cluster(
        settings.hosts, settings.port, settings.datacenter, settings.consistency, reactor, settings.compression
    )
    connection = Connection(cluster, session, settings.keyspace)
    try:
        create_schema(session, settings.keyspace, settings.replication, settings.datacenter, tables)
    except BaseException:
        connection.close()
        raise
    return connection


def open_cluster(
    hosts: Iterable[str],
    port: int,
    datacenter: str,
    consistency: str,
    reactor: str = "libev",
    compression: str = "lz4",
) -> tuple[Cluster, Session]:
    """A connected cluster and session with this module's settings (the caller shuts the
    cluster down; open_session wraps it in a Connection); the reactor: see _connection_class;
    `compression` of the protocol's frames, lz4 or none (ADR-0032). The session writes the
    batches of adapters/cassandra/batches.py."""
    if compression not in ("lz4", "none"):
        raise ValueError(f"compression={compression!r}: lz4 or none")

    def profile(row_factory: Any) -> ExecutionProfile:
        return ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=datacenter)),
            consistency_level=ConsistencyLevel.name_to_value[consistency],
            request_timeout=TIMEOUT,
            row_factory=row_factory,
        )

    cluster = Cluster(
        list(hosts),
        port=port,
        protocol_version=5,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile(dict_factory), TUPLE_ROWS: profile(tuple_factory)},
        connection_class=_connection_class(reactor),
        reconnection_policy=ExponentialReconnectionPolicy(*RECONNECT_DELAYS),
        compression="lz4" if compression == "lz4" else False,
    )
    try:
        session = cluster.connect()
        batches.install(session)  # batches serialized by adapters/cassandra/batches.py (ADR-0039)
        return cluster, session
    except BaseException:
        cluster.shutdown()
        raise


def _connection_class(reactor: str) -> Any:
    """libev (the default): the asyncio reactor let the process exit at once after
    shutdown() (libev's atexit joins its loop thread for up to 5 s), but it failed 3 of 4
    100k-member fan-outs with "CRC mismatch on header" (protocol 5 framing) where libev
    failed none: a slower exit beats a mailbox write that cannot land. ADR-0014."""
    if reactor == "libev":
        from cassandra.io.libevreactor import LibevConnection

        return LibevConnection
    if reactor != "asyncio":
        raise ValueError(f"reactor={reactor!r}: asyncio or libev")
    return AsyncioConnection


def run(
    session: Session,
    statements: Iterable[tuple[Any, Any]],
    in_flight: int,
    at: tuple[int, Callable[[], None]] | None = None,
) -> None:
    """Execute statements with at most `in_flight` requests in the air. `at` = (n, step):
    `step` is called once n statements are sent (a named step inside a round, where a
    failpoint can stop or kill the process; n = 0 or past the end: never). After an error no
    further statement is sent, the ones in the air are waited for, then the first error
    raises: nothing of a failed round is still landing when its caller retries it, or drops
    the keyspace it wrote to. (The driver's execute_concurrent with raise_on_first_error
    returns at once; a verify whose build failed on a WriteTimeout then dropped its scratch
    keyspace under mutations still in flight, and Cassandra 5.0.9 answered "Unknown CF" to
    other keyspaces' requests for minutes after.)"""
    cond = threading.Condition()
    errors: list[BaseException] = []
    pending = 0
    sent = 0

    def landed(_result: Any) -> None:
        nonlocal pending
        with cond:
            pending -= 1
            cond.notify()

    def failed(exc: BaseException) -> None:
        nonlocal pending
        with cond:
            errors.append(exc)
            pending -= 1
            cond.notify()

    todo = iter(statements)
    while True:
        with cond:  # a slot free and no failure seen: only then is the next statement taken
            while pending >= in_flight and not errors:
                cond.wait()
            if errors:
                break
        taken = next(todo, None)
        if taken is None:
            break
        statement, params = taken
        if at is not None and sent == at[0] and sent:
            try:
                at[1]()
            except BaseException as exc:  # e.g. fenced: the ones in the air are waited for, as after an error
                with cond:
                    errors.append(exc)
                break
        sent += 1
        with cond:
            pending += 1
        try:
            session.execute_async(statement, params).add_callbacks(landed, failed)
        except BaseException as exc:  # not sent: nothing to wait for
            failed(exc)
            break
    with cond:
        while pending:
            cond.wait()
    if errors:
        raise errors[0]


# -- the driver's log ------------------------------------------------------------------------


class _OneLineConnectionErrors(logging.Filter):
    """While Cassandra is away the driver logs a traceback for every failed connection and
    reconnection attempt (a WARNING with exc_info, every few seconds): an operator needs the
    one line, "Error connecting to 127.0.0.1:19042: ConnectionRefusedError: ...", not the stack.
    Its warnings lose their stack; its errors keep it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and record.levelno <= logging.WARNING:  # connection trouble, retried by the driver
            record.msg = f"{record.getMessage().rstrip(': ')}: {type(exc).__name__}: {exc}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


class _GroupedBatchWarnings(logging.Filter):
    """The driver logs every server warning; an UNLOGGED batch of members (one partition
    each) is warned about by design (unlogged_batch_across_partitions_warn_threshold):
    that one is dropped, one per batch would flood the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.args and "Unlogged batch covering" in str(record.args[0] if isinstance(record.args, tuple) else "")
        )


def _install(logger: logging.Logger, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


for _name in ("cassandra.cluster", "cassandra.pool", "cassandra.connection"):
    _install(logging.getLogger(_name), _OneLineConnectionErrors)
_install(logging.getLogger("cassandra.protocol"), _GroupedBatchWarnings)
