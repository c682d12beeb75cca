"""The Connection that the Cassandra views and mailbox share (adapters/cassandra/connect.py):
whoever owns it may close it any number of times; the Cluster is shut down once."""

from __future__ import annotations

import threading
from typing import Any

from adapters.cassandra.connect import Connection


class FakeCluster:
    def __init__(self) -> None:
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_closing_a_connection_twice_shuts_its_cluster_down_once() -> None:
    cluster = FakeCluster()
    connection = Connection(cluster, session=None, keyspace="ks")  # type: ignore[arg-type]
    assert not connection.closed
    connection.close()
    connection.close()
    assert connection.closed and cluster.shutdowns == 1


def test_owners_closing_at_once_shut_the_cluster_down_once() -> None:
    cluster = FakeCluster()
    connection = Connection(cluster, session=None, keyspace="ks")  # type: ignore[arg-type]
    threads = [threading.Thread(target=connection.close) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cluster.shutdowns == 1


def test_a_with_block_closes_it() -> None:
    cluster: Any = FakeCluster()
    with Connection(cluster, session=None, keyspace="ks") as connection:  # type: ignore[arg-type]
        assert not connection.closed
    assert cluster.shutdowns == 1
