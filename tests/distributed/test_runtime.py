"""The distributed runtime end to end on the real engines: commands on an API replica
(PostgreSQL), `fanout relay` and `fanout worker` as subprocesses (Kafka, Faust), the views
read back from Cassandra by the replica, with the same queries as the embedded runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.distributed.cluster import Cluster, cluster_for

T = "acme"


@pytest.fixture
def cluster(fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path) -> Iterator[Cluster]:
    c = cluster_for(
        {"FANOUT_EVENT_STORE": fresh_postgres, "FANOUT_LOG": fresh_kafka, "FANOUT_VIEWS": fresh_cassandra},
        tmp_path / "logs",
        FANOUT_PER_SENDER_IN_CONVERSATION_RATE="1000/s",
    )
    try:
        c.replica()  # creates the event store tables and the keyspace before the others start
        c.start("relay")
        c.start("worker")
        c.wait_workers(1)
        yield c
    finally:
        c.close()


def test_a_send_reaches_every_mailbox_and_the_session_list(cluster: Cluster) -> None:
    rt = cluster.runtimes[0]
    rt.app.create_conversation(T, "g", "general", ["a", "b", "c"])
    sent = rt.app.send_message(T, "g", sender="a", text="hello @b", mentions=["b"])
    assert rt.wait_until(sent["position"], timeout=60), cluster.log_of("worker")
    sessions, _ = rt.queries.session_list(T, "b")
    (item,) = [s for s in sessions if s["conversation_id"] == "g"]
    assert item["unread_count"] == 1 and item["mention_count"] == 1, item
    assert item["write_policy"] == "always"
    for user in ("a", "b", "c"):
        entries = rt.queries.mailbox(T, user, 0, 10)["entries"]
        assert [e["conversation_seq"] for e in entries] == [1], (user, entries)
    assert rt.queries.delivery(T, "g", 1)["materialized_at"] is not None


def test_a_second_replica_reads_what_the_first_wrote(cluster: Cluster) -> None:
    first = cluster.runtimes[0]
    second = cluster.replica()
    first.app.create_conversation(T, "g", "general", ["a", "b"])
    r = second.app.send_message(T, "g", sender="b", text="from the other replica")
    assert first.wait_until(r["position"], timeout=60)
    assert first.queries.head(T, "g")["latest_conversation_seq"] == 1
    health = second.check()
    assert health["workers"] >= 1 and not health.get("errors"), health
    assert health["relay_position"] >= r["position"]
