"""The distributed runtime end to end on the real engines: commands on an API replica
(PostgreSQL), `fanout relay` and `fanout worker` as subprocesses (Kafka, Faust), the views
read back from Cassandra by the replica, with the same queries as the embedded runtime."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout import distributed
from tests.distributed.cluster import Cluster, cluster_for, running_cluster

T = "acme"


@pytest.fixture
def cluster(fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(fresh_postgres, fresh_kafka, fresh_cassandra, tmp_path / "logs") as c:
        yield c


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


def test_a_replica_learns_the_views_position_from_the_workers_commits_not_its_poll(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers publish the positions each commit left (ViewsTracked): a replica whose
    watcher reads the views once a minute still sees each send projected within seconds."""
    monkeypatch.setattr(distributed, "WATCH_INTERVAL", 60.0)
    rt = cluster.replica()  # its watcher reads the views at start, then not for a minute
    rt.app.create_conversation(T, "g", "general", ["a", "b"])
    for i in range(3):
        sent = rt.app.send_message(T, "g", sender="a", text=f"m{i}")
        started = time.monotonic()
        assert rt.wait_until(sent["position"], timeout=10), cluster.log_of("worker")
        assert time.monotonic() - started < 5.0
        assert rt.queries.head(T, "g")["latest_conversation_seq"] == i + 1
    assert len(rt._published) == rt.partitions  # every partition's position came from a worker


def test_a_replica_keeps_the_heads_its_logins_read_and_a_commit_elsewhere_drops_them(cluster: Cluster) -> None:
    """ADR-0035: the second login of a user reads no head from Cassandra, and a message sent
    through another replica is in the next login of a reader that waited for its position
    (the worker's commit record dropped the head first, or the cache stood aside)."""
    rt, other = cluster.runtimes[0], cluster.replica()
    cache = rt.head_cache
    assert cache is not None
    for i in range(5):
        rt.app.create_conversation(T, f"g{i}", f"group {i}", ["a", "b"])
    sent = rt.app.send_message(T, "g0", sender="b", text="first")
    assert rt.wait_until(sent["position"], timeout=60), cluster.log_of("worker")
    deadline = time.monotonic() + 20
    while True:  # until the chains stand where the views do (the records of the creates are in)
        rt.queries.session_list(T, "a")
        before = cache.stats.hits
        rt.queries.session_list(T, "a")
        if cache.stats.hits - before >= 5:
            break
        assert time.monotonic() < deadline, cache.stats
        time.sleep(0.1)
    for n in range(3):
        r = other.app.send_message(T, "g3", sender="b", text=f"later {n}")
        assert rt.wait_until(r["position"], timeout=60), cluster.log_of("worker")
        sessions, _ = rt.queries.session_list(T, "a")
        (item,) = [s for s in sessions if s["conversation_id"] == "g3"]
        assert item["latest_conversation_seq"] == n + 1 and item["preview"] == f"later {n}", item
        assert [s["conversation_id"] for s in sessions][0] == "g3", sessions
    assert cache.stats.dropped >= 1 and cache.stats.resets == 0, cache.stats


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


def test_the_replicas_count_the_workers_by_their_heartbeats(cluster: Cluster) -> None:
    """A worker is alive while its heartbeats reach the replica (ADR-0019): a new replica
    knows it at once; a stopped worker leaves at once; a killed one (no last beat) within
    a few beat intervals; and /readyz's check lists the partitions nobody holds."""
    import signal
    import time

    first = cluster.runtimes[0]
    health = first.check()
    assert health["workers"] == 1 and health["unassigned_partitions"] == [], health
    late = cluster.replica()  # started after the worker's beats: reads the last ones back
    assert late.links.workers() == 1

    cluster.start("worker-2")
    cluster.wait_workers(2)
    cluster.kill("worker-2", signal.SIGTERM)  # stopped: its last beat says so
    t0 = time.monotonic()
    while first.links.workers() > 1:
        assert time.monotonic() - t0 < 3.0, "a stopped worker still counted"
        time.sleep(0.05)

    cluster.kill("worker")  # kill -9: no last beat
    t0 = time.monotonic()
    while first.links.workers() > 0:
        assert time.monotonic() - t0 < 10.0, "a killed worker still counted"
        time.sleep(0.1)
    assert first.check()["workers"] == 0 and "unassigned_partitions" not in first.check()


def test_t1_fires_on_the_platform_rate_summed_over_the_partitions(
    fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path
) -> None:
    """Twelve groups spread over the topic's 4 partitions, each over its share of nothing:
    every partition's own rate stays under T1, their sum is over it. One T1 review opens
    (ADR-0020), evaluated over the merged windows by the worker holding partition 0."""
    import time

    from projections.capacity import CapacityProjection, state_name

    window, budget = 3.0, 40.0  # T1 = 0.7 x 40 = 28 entries/s over 3 s
    c = cluster_for(
        {"FANOUT_EVENT_STORE": fresh_postgres, "FANOUT_LOG": fresh_kafka, "FANOUT_VIEWS": fresh_cassandra},
        tmp_path / "logs",
        FANOUT_PER_SENDER_IN_CONVERSATION_RATE="1000/s",
        FANOUT_CAPACITY_WINDOW=f"{window}s",
        FANOUT_PLATFORM_FANOUT_BUDGET=str(budget),
    )
    try:
        rt = c.replica()
        c.start("relay")
        c.start("worker")
        c.wait_workers(1)
        groups = [f"g{i}" for i in range(12)]
        for g in groups:
            rt.app.create_conversation(T, g, g, ["a", "b", "c"])
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < window + 2.5:  # one message per group a second: 36 entries/s
            tick = time.monotonic()
            for g in groups:
                rt.app.send_message(T, g, sender="abc"[n % 3], text="x")
            n += 1
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        c.settle(rt, timeout=60)
        deadline = time.monotonic() + 30
        while not (reviews := [r for r in rt.queries.reviews(T) if r["trigger"] == "T1"]):
            assert time.monotonic() < deadline, f"no T1 review: {c.log_of('worker')}"
            time.sleep(0.2)
        time.sleep(2.0)  # later evaluations of the same episode open nothing more
        reviews = [r for r in rt.queries.reviews(T) if r["trigger"] == "T1"]
        assert len(reviews) == 1, reviews
        limit = 0.7 * budget
        params = load_params(c)
        shares = [
            CapacityProjection(params, state=rt.views.capacity_state(state_name(p)) or {}).rates()[
                "fanout_entries_per_sec"
            ]
            for p in range(rt.partitions)
        ]
        assert max(shares) < limit < sum(shares), (shares, limit)  # no partition alone was over
        assert rt.capacity().firing.get("T1") is True
    finally:
        c.close()


def load_params(c: Cluster) -> Any:
    from fanout.config import load_settings

    return load_settings({**c.urls, **c.settings_env}).params
