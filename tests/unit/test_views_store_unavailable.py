"""Cassandra answering that too few replicas did (quorum lost) is 503 UNAVAILABLE with a retry
hint, never a bare 500 (ADR-0027; found by tests/cluster: a read with two of three nodes down).
The Cassandra stores raise the driver's errors as StorageUnavailable (adapters/cassandra/errors.py);
the layers above answer the port error and never look for the driver's names."""

from __future__ import annotations

from pathlib import Path

import pytest
from cassandra import ConsistencyLevel, InvalidRequest, ReadTimeout, Unavailable, WriteTimeout
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionShutdown

from adapters.cassandra.errors import cassandra_boundary
from fanout.overload import STORAGE_RETRY_MS, startup_error, storage_unavailable
from projections.errors import StorageUnavailable


@cassandra_boundary
class Store:
    """A store whose one read fails with what the driver raised."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def head(self) -> None:
        raise self.exc


@pytest.mark.parametrize(
    "exc",
    [
        ReadTimeout("received only 1 responses", consistency=ConsistencyLevel.LOCAL_QUORUM, required_responses=2, received_responses=1),
        WriteTimeout("received only 1 responses", write_type=0),
        Unavailable("Cannot achieve consistency level LOCAL_QUORUM"),
        NoHostAvailable("Unable to connect to any servers", {}),
        ConnectionShutdown("Connection to 127.0.0.1:9042 was closed"),
    ],
    ids=type,
)
def test_quorum_lost_is_unavailable(exc: Exception) -> None:
    with pytest.raises(StorageUnavailable) as raised:
        Store(exc).head()
    assert raised.value.__cause__ is exc
    u = storage_unavailable(raised.value)
    assert u is not None
    assert u.details["reason"] == "storage_error" and u.details["retry_after_ms"] == STORAGE_RETRY_MS
    assert str(exc).split("\n")[0] in u.message  # the driver's own words
    assert startup_error(Path("data"), raised.value) is None  # not the data dir's


def test_wrapped_and_unrelated() -> None:
    try:
        try:
            Store(ReadTimeout("timed out")).head()
        except StorageUnavailable as inner:
            raise RuntimeError("reading the head") from inner
    except RuntimeError as outer:
        assert storage_unavailable(outer) is not None
    assert storage_unavailable(ValueError("Unavailable")) is None
    assert storage_unavailable(ReadTimeout("timed out")) is None  # the driver's, untranslated: a bug to see

    with pytest.raises(InvalidRequest):  # the request's own error is not a storage failure
        Store(InvalidRequest("unconfigured table heads")).head()
