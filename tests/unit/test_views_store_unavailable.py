"""Cassandra answering that too few replicas did (quorum lost) is 503 UNAVAILABLE with a retry
hint, never a bare 500 (ADR-0027; found by tests/cluster: a read with two of three nodes down)."""

from __future__ import annotations

import pytest
from cassandra import ConsistencyLevel, ReadTimeout, Unavailable, WriteTimeout
from cassandra.cluster import NoHostAvailable

from fanout.overload import STORAGE_RETRY_MS, storage_unavailable


@pytest.mark.parametrize(
    "exc",
    [
        ReadTimeout("received only 1 responses", consistency=ConsistencyLevel.LOCAL_QUORUM, required_responses=2, received_responses=1),
        WriteTimeout("received only 1 responses", write_type=0),
        Unavailable("Cannot achieve consistency level LOCAL_QUORUM"),
        NoHostAvailable("Unable to connect to any servers", {}),
    ],
    ids=type,
)
def test_quorum_lost_is_unavailable(exc: Exception) -> None:
    u = storage_unavailable(exc)
    assert u is not None
    assert u.details["reason"] == "storage_error" and u.details["retry_after_ms"] == STORAGE_RETRY_MS


def test_wrapped_and_unrelated() -> None:
    try:
        try:
            raise ReadTimeout("timed out")
        except ReadTimeout as inner:
            raise RuntimeError("reading the head") from inner
    except RuntimeError as outer:
        assert storage_unavailable(outer) is not None
    assert storage_unavailable(ValueError("Unavailable")) is None

    class ReadTimeoutElsewhere(Exception):  # same name, not the driver's
        pass

    assert storage_unavailable(ReadTimeoutElsewhere()) is None
