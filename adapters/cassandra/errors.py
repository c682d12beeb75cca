"""The Cassandra driver's errors as the port errors (projections/errors.py), translated at
the boundary of every Cassandra store (views.py with its login reads, mailbox.py,
rebuild.py): a cluster that does not answer (too few replicas, a request timed out, no
node or connection left, a node overloaded or starting: ADR-0027) is StorageUnavailable.
The request's own errors (an invalid query, a missing keyspace, a refused login) are left
as the driver raised them: they are bugs or settings to fix, not a storage failure."""

from __future__ import annotations

from cassandra import CoordinationFailure, OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy, ConnectionException
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage

from projections.errors import StorageUnavailable, storage_boundary

NOT_ANSWERED = (
    Unavailable,  # too few replicas alive for the consistency level
    Timeout,  # ReadTimeout, WriteTimeout: too few replicas answered in time
    CoordinationFailure,  # ReadFailure, WriteFailure: replicas answered with a failure
    OperationTimedOut,  # the client's own timeout
    NoHostAvailable,
    ConnectionException,  # ConnectionShutdown: the node went away mid-request
    ConnectionBusy,
    OverloadedErrorMessage,
    IsBootstrappingErrorMessage,
)


def storage_error(exc: BaseException) -> StorageUnavailable | None:
    """The port error of a driver's error, None for the request's own errors."""
    return StorageUnavailable(f"{type(exc).__name__}: {exc}") if isinstance(exc, NOT_ANSWERED) else None


cassandra_boundary = storage_boundary(NOT_ANSWERED, storage_error)
