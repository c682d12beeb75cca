"""Node loss on the three-node cluster (ADR-0027): Cassandra RF 3 at
LOCAL_QUORUM, Kafka with 3 replicas and min.insync.replicas=2, producers acks=all.

The deployment is the crash tests' (tests/distributed/test_crash.py: its own database, topic
and keyspace; the relay and a worker as subprocesses; one large group), on the cluster of
`make cluster-up`; an API replica serves HTTP in a thread (tests/distributed/test_fresh_reads.py's
`Http`). Each run sends a burst over HTTP (about RATE sends/s, each with its own
client_msg_id) and, once the run's first message is fanning out, loses engine nodes:

* a: kill -9 of one Cassandra node (a different one each run), restarted a few seconds later;
* b: kill -9 of the Kafka broker leading the conversation's partition, restarted;
* c: kill -9 of two Cassandra nodes at once (quorum lost): reads answer 503 UNAVAILABLE, then
  both come back.

A burst is at most BURST acknowledged sends (it ends earlier when the node is back). Every
send answers 200/201, or 503 UNAVAILABLE with Retry-After (then it is retried with the
same client_msg_id after that delay); never another 5xx, never a hang (30 s client timeout).
After each run every acknowledged message is in the history and materialized to every member;
after the three runs the crash tests' `verify`: heads, messages, delivery records, member
states and every mailbox (exactly once) equal what the embedded projections build from the
PostgreSQL log, exact session counts, and `fanout verify` finds no difference. Each run prints
how long the node took to come back and how long the views took to catch up after it.

Group size: FANOUT_CRASH_MEMBERS (as in test_crash; `make test-cluster` sets 10,000, see
docs/adr/0027-three-node-cluster.md); RUNS runs of each scenario (FANOUT_CRASH_RUNS: 3 in `make test-cluster`, 1 in .ci/run)."""

from __future__ import annotations

import collections
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fanout.security import mint_token
from fanout.urls import kafka_settings
from streams.routing import conversation_partition
from tests.cluster.conftest import NODES, node
from tests.distributed.test_crash import (  # noqa: F401  (deployment: the fixture, reused)
    CID,
    MEMBERS,
    MENTIONED,
    RUNS,
    SEED,
    SENDERS,
    Deployment,
    Supervisor,
    T,
    check_run,
    deployment,
    verify,
    wait_fanout_started,
)
from tests.distributed.test_fresh_reads import SECRET, Http

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RATE = 1.0  # sends per second in a burst (10,000 entries a second at 10k members)
BURST = 20  # acknowledged sends at most per run: a node's restart takes 40-140 s here, and a burst
# running all that time left minutes of fan-out to catch up (200,000 entries a run at 10k members)
CLIENT_TIMEOUT = 30.0  # an answer slower than this is a hang


class Api(Http):
    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any], str]:
        """(status, JSON body, Retry-After) of one request; raises on a timeout (a hang)."""
        token = mint_token(SECRET, T, "service", "svc")
        req = urllib.request.Request(
            f"{self.url}/v1{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT) as r:
                return r.status, json.loads(r.read()), r.headers.get("Retry-After", "")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}"), e.headers.get("Retry-After", "")


@pytest.fixture
def api(deployment: Deployment) -> Iterator[Api]:  # noqa: F811
    a = Api(deployment.rt)
    try:
        yield a
    finally:
        a.close()


class Burst:
    """Sends over HTTP at RATE from a thread until stopped. A 503 UNAVAILABLE with Retry-After
    is retried with the same client_msg_id after that delay; anything else that is not a
    200/201 (or no answer within CLIENT_TIMEOUT) is kept in `bad`."""

    def __init__(self, d: Deployment, api: Api, tag: str) -> None:
        self.d, self.api, self.tag = d, api, tag
        self.acked: dict[int, str] = {}  # seq -> message id
        self.refused: collections.Counter[str] = collections.Counter()  # 503 reason -> count
        self.bad: list[Any] = []
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.acked) < BURST:
            i = self.d.sent
            body = {
                "sender": SENDERS[i % len(SENDERS)],
                "text": f"{self.tag} message {i}",
                "mentions": [MENTIONED] if i % 2 == 0 else [],
                "client_msg_id": f"{self.tag}-{i}",
            }
            while True:  # until this message is answered for good
                t0 = time.monotonic()
                try:
                    status, reply, retry_after = self.api.call("POST", f"/conversations/{CID}/messages", body)
                except Exception as exc:  # a timeout (hang) or a dropped connection
                    self.bad.append(f"{body['client_msg_id']}: {exc!r} after {time.monotonic() - t0:.1f} s")
                    break
                self.slowest = max(self.slowest, time.monotonic() - t0)
                if status in (200, 201):
                    self.acked[int(reply["conversation_seq"])] = str(reply["message_id"])
                    self.d.acked.add(str(reply["message_id"]))
                    break
                if status == 503 and reply.get("error") == "UNAVAILABLE" and retry_after.isdigit():
                    self.refused[str(reply.get("details", {}).get("reason"))] += 1
                    if self._stop.wait(min(float(retry_after), 2.0)):
                        return  # stopped while refused: this client_msg_id was never acknowledged
                    continue
                self.bad.append((body["client_msg_id"], status, reply, retry_after))
                break
            self.d.sent += 1
            self._stop.wait(1.0 / RATE)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(CLIENT_TIMEOUT + 10)
        assert not self._thread.is_alive(), "a send hung"


def views_hosts_up(d: Deployment) -> int:
    views: Any = d.rt.views
    return len([h for h in views.session.cluster.metadata.all_hosts() if h.is_up])


def healthy(d: Deployment, timeout: float = 180.0) -> float:
    """Until the replica's driver sees the three Cassandra nodes up and every partition of the
    topic has its three replicas in sync again; returns the wait."""
    from confluent_kafka.admin import AdminClient

    k = kafka_settings(d.cluster.urls["FANOUT_LOG"])
    admin = AdminClient({"bootstrap.servers": k.brokers})
    t0 = time.monotonic()
    while True:
        t = admin.list_topics(k.topic, timeout=10).topics.get(k.topic)
        isr_full = t is not None and t.partitions and all(len(p.isrs) == 3 for p in t.partitions.values())
        if isr_full and views_hosts_up(d) == 3:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"cluster not whole after {timeout} s: {t and t.partitions}"
        time.sleep(0.5)


def leader_of_conversation(d: Deployment) -> tuple[int, int]:
    """(the conversation's partition, the node id of the broker leading it)."""
    from confluent_kafka.admin import AdminClient

    k = kafka_settings(d.cluster.urls["FANOUT_LOG"])
    part = conversation_partition(T, CID, d.rt.partitions)
    md = AdminClient({"bootstrap.servers": k.brokers}).list_topics(k.topic, timeout=10)
    return part, int(md.topics[k.topic].partitions[part].leader)


def loss_run(
    d: Deployment,
    api: Api,
    sup: Supervisor,
    scenario: str,
    run: int,
    lose: Callable[[], str],
    restore: Callable[[], float],
    while_down: Callable[[], str] | None = None,
) -> None:
    r = random.Random(f"{SEED}/cluster-{scenario}/{run}")
    started = time.monotonic()
    whole = healthy(d)
    first = check_run(d) + 1
    burst = Burst(d, api, f"{scenario}{run}")
    t0 = time.monotonic()
    while len(burst.acked) < 2:
        assert time.monotonic() - t0 < 60 and not burst.bad, f"the burst did not start: {burst.bad}"
        time.sleep(0.1)
    wait_fanout_started(d, first, timeout=120)
    delay = r.uniform(0.0, 1.5)
    time.sleep(delay)
    what = lose()
    lost_at = time.monotonic()
    down_for = r.uniform(3.0, 8.0)
    restored = False
    try:
        probed = while_down() if while_down is not None else ""
        time.sleep(max(0.0, down_for - (time.monotonic() - lost_at)))
        up = restore()
        restored = True
    finally:
        back = time.monotonic()
        burst.stop()
        if not restored:  # a failed probe: the nodes come back before the deployment is torn down
            restore()
    caught = sup.settle(d, timeout=600)
    catch_up = time.monotonic() - back
    latest = check_run(d)
    assert not burst.bad, f"sends answered neither 2xx nor 503 UNAVAILABLE + Retry-After: {burst.bad[:5]}"
    missing = {s: m for s, m in burst.acked.items() if d.rt.views.delivery(T, CID, s) is None}
    assert not missing, missing
    note = (
        f"cluster-{scenario} run {run}: {what} {delay:.2f} s into message {first}'s fan-out, down {down_for:.1f} s"
        f"{'; ' + probed if probed else ''}; back up in {up:.1f} s; views caught up {catch_up:.1f} s after it "
        f"({caught:.1f} s of settling); {len(burst.acked)} sends acknowledged, refused {dict(burst.refused) or 'none'}, "
        f"slowest answer {burst.slowest:.2f} s; restarted: {sup.restarted or 'none'}; latest seq {latest}; "
        f"cluster whole after {whole:.1f} s; run {time.monotonic() - started:.1f} s"
    )
    print(note, flush=True)
    d.notes.append(note)


def test_cluster_a_kill_9_of_one_cassandra_node(deployment: Deployment, api: Api) -> None:  # noqa: F811
    d, sup = deployment, Supervisor(deployment.cluster)
    for run in range(RUNS):
        n = NODES[run % len(NODES)]

        def lose(n: int = n) -> str:
            node("cassandra", n, "kill")
            return f"Cassandra node {n} killed (-9)"

        loss_run(d, api, sup, "a", run, lose, lambda n=n: node("cassandra", n, "start"))  # type: ignore[misc]
    d.notes.append(verify(d))


def test_cluster_b_kill_9_of_the_kafka_partition_leader(deployment: Deployment, api: Api) -> None:  # noqa: F811
    d, sup = deployment, Supervisor(deployment.cluster)
    for run in range(RUNS):
        victim: list[int] = []

        def lose(victim: list[int] = victim) -> str:
            part, leader = leader_of_conversation(d)
            assert leader in NODES, f"partition {part} has no leader ({leader})"
            victim.append(leader)
            node("kafka", leader, "kill")
            return f"Kafka broker {leader} (leader of partition {part}) killed (-9)"

        def restore(victim: list[int] = victim) -> float:
            return node("kafka", victim[0], "start")

        loss_run(d, api, sup, "b", run, lose, restore)
    d.notes.append(verify(d))


def test_cluster_c_two_cassandra_nodes_lost_at_once(deployment: Deployment, api: Api) -> None:  # noqa: F811
    d, sup = deployment, Supervisor(deployment.cluster)
    for run in range(RUNS):
        pair = (NODES[run % 3], NODES[(run + 1) % 3])

        def lose(pair: tuple[int, int] = pair) -> str:
            threads = [threading.Thread(target=node, args=("cassandra", n, "kill")) for n in pair]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return f"Cassandra nodes {pair[0]} and {pair[1]} killed (-9) together"

        def while_down() -> str:
            """Reads of the views need 2 replicas of 3: the API refuses them with 503."""
            seen: collections.Counter[str] = collections.Counter()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                status, reply, retry_after = api.call("GET", f"/conversations/{CID}")
                assert status == 200 or (status == 503 and reply.get("error") == "UNAVAILABLE" and retry_after), (
                    status,
                    reply,
                    retry_after,
                )
                seen[f"{status} {reply.get('details', {}).get('reason', '')}".strip()] += 1
                if status == 503:
                    break
                time.sleep(0.5)
            assert any(k.startswith("503") for k in seen), f"reads never refused with quorum lost: {dict(seen)}"
            return f"reads while down: {dict(seen)}"

        def restore(pair: tuple[int, int] = pair) -> float:
            t0 = time.monotonic()
            out: list[BaseException] = []

            def start(n: int) -> None:
                try:
                    node("cassandra", n, "start")
                except BaseException as exc:
                    out.append(exc)

            threads = [threading.Thread(target=start, args=(n,)) for n in pair]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not out, out
            return time.monotonic() - t0

        loss_run(d, api, sup, "c", run, lose, restore, while_down)
    d.notes.append(verify(d))
