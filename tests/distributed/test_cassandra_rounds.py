"""A round of requests (adapters/cassandra/connect.py `run`) that fails stops sending and
waits for what it sent before it raises: nothing of a failed round is still landing when
its caller retries it or drops the keyspace it wrote to (a verify that dropped its scratch
keyspace under writes still in flight left Cassandra answering "Unknown CF" to other
keyspaces' requests for minutes in a suite run of 2026-12-04)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cassandra.query import SimpleStatement

from adapters.cassandra.connect import open_session, run
from fanout.urls import cassandra_settings


@pytest.fixture
def keyspace(fresh_cassandra: str) -> Iterator[tuple[Any, str, Any]]:
    """(a session, its keyspace, the prepared insert of a capacity row)."""
    settings = cassandra_settings(fresh_cassandra)
    connection = open_session(settings)
    session, ks = connection.session, settings.keyspace
    try:
        yield session, ks, session.prepare(f"INSERT INTO {ks}.capacity (projection, body) VALUES (?, ?)")
    finally:
        connection.close()


def test_a_failed_round_sends_nothing_more_and_leaves_nothing_in_flight(keyspace: tuple[Any, str, Any]) -> None:
    session, ks, insert = keyspace
    bad = SimpleStatement(f"INSERT INTO {ks}.no_such_table (name) VALUES ('x')")
    sent: list[int] = []

    def statements() -> Iterator[tuple[Any, Any]]:
        for i in range(400):
            sent.append(i)
            yield (bad, None) if i == 50 else (insert, (f"n{i:03d}", "{}"))

    with pytest.raises(Exception, match="no_such_table"):
        run(session, statements(), in_flight=8)
    # sending stopped once the failure was seen (a few round trips after it, not the 349 left)
    assert 51 <= len(sent) < 400, len(sent)
    # and every insert that was sent had landed when run raised (read at once, nothing awaited)
    landed = {r["projection"] for r in session.execute(f"SELECT projection FROM {ks}.capacity")}
    assert landed == {f"n{i:03d}" for i in sent if i != 50}


def test_a_round_that_succeeds_writes_everything(keyspace: tuple[Any, str, Any]) -> None:
    session, ks, insert = keyspace
    run(session, ((insert, (f"m{i:04d}", "{}")) for i in range(1000)), in_flight=50)
    assert session.execute(f"SELECT count(*) AS n FROM {ks}.capacity").one()["n"] == 1000


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_the_views_url_chooses_the_protocol_compression(fresh_cassandra: str, compression: str) -> None:
    """`?compression=` (ADR-0032) reaches the driver: lz4 frames are negotiated, or none."""
    import dataclasses

    settings = dataclasses.replace(cassandra_settings(fresh_cassandra), compression=compression)
    with open_session(settings, tables=()) as c:
        connection = c.cluster.control_connection._connection
        assert (connection.compressor is not None) == (compression == "lz4")
        assert c.session.execute("SELECT release_version FROM system.local").one()["release_version"]
