"""Fresh reads (`min_position`) while one log partition stalls, on the
real engines: relay and two workers as subprocesses, an API replica serving HTTP.

The worker holding conversation A's partition is paused (SIGSTOP: a GC pause, a VM
stall; its session timeout is long, so nobody takes its partitions over during the test).
A read of conversation B, whose partition the other worker holds, at the position of B's
latest write answers at once: it waits for B's partition only (streams/routing.py says
which). A read of A at its position, and reads that span conversations (the session list,
the mailbox cursor), wait for the views' position (the lowest over every partition) and answer 503 after
FANOUT_FRESH_READ_TIMEOUT; the mailbox cursor never serves an entry past the low
watermark. Once the worker resumes, A's read answers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from api.app import create_app
from api.reads import delivery, fresh_read, history, rebuild, scope
from fanout.distributed import DistributedRuntime
from fanout.security import mint_token
from streams.routing import conversation_partition
from tests.distributed.cluster import ROOT, Cluster, cluster_for

T = "acme"
SECRET = "fresh-reads-" + "x" * 40
TIMEOUT = 3.0  # FANOUT_FRESH_READ_TIMEOUT: what a read of a stalled partition costs the test


class Http:
    """The replica's API on 127.0.0.1, in a thread of its own (as `fanout serve` runs it)."""

    def __init__(self, rt: DistributedRuntime) -> None:
        self.app = create_app(rt, SECRET)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(self.app)
        self.url = ""
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "the API did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())

    def get(self, path: str, role: str = "service", sub: str = "svc", **query: Any) -> tuple[int, dict[str, Any]]:
        url = f"{self.url}/v1{path}" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
        token = mint_token(SECRET, T, role, sub)
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(15)


@pytest.fixture
def cluster(fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path) -> Iterator[Cluster]:
    c = cluster_for(
        {"FANOUT_EVENT_STORE": fresh_postgres, "FANOUT_LOG": fresh_kafka, "FANOUT_VIEWS": fresh_cassandra},
        tmp_path / "logs",
        FANOUT_PER_SENDER_IN_CONVERSATION_RATE="1000/s",
        FANOUT_FRESH_READ_TIMEOUT=f"{TIMEOUT}s",
    )
    try:
        c.replica()  # creates the event store tables and the keyspace before the others start
        c.start("relay")
        # a session timeout longer than the test: the paused worker keeps its partitions
        start_worker(c, "worker", session_timeout=60)
        start_worker(c, "worker-2", session_timeout=60)
        c.wait_workers(2)
        yield c
    finally:
        for name in ("worker", "worker-2"):
            if name in c.procs:
                c.resume(name)
        c.close()


def start_worker(c: Cluster, name: str, session_timeout: float) -> None:
    """`python -m cli.worker` as Cluster.start runs it, with its own session timeout."""
    log = open(c.logs / f"{name}.log", "ab")  # noqa: SIM115 (owned by the process)
    args = [sys.executable, "-m", "cli.worker", "--session-timeout", str(session_timeout)]
    c.procs[name] = subprocess.Popen(args, cwd=ROOT, env=c.env(), stdout=log, stderr=subprocess.STDOUT)


def holdings(rt: DistributedRuntime, cluster: Cluster, timeout: float = 60.0) -> dict[str, set[int]]:
    """worker name -> the partitions it holds, once the two workers' beats show a split of
    every partition that has not changed for a second."""
    pids = {str(proc.pid): name for name, proc in cluster.procs.items() if name.startswith("worker")}
    deadline = time.monotonic() + timeout
    last: dict[str, set[int]] = {}
    since = time.monotonic()
    while True:
        now: dict[str, set[int]] = {}
        for beat in rt.links.beats.alive():  # KafkaReplicaLinks
            name = pids.get(beat.worker.split(":")[1])
            if name is not None:
                now[name] = set(beat.partitions)
        split = (
            len(now) == 2
            and all(now.values())
            and set.union(*now.values()) == set(range(rt.partitions))
            and not set.intersection(*now.values())
        )
        if not split or now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return now
        assert time.monotonic() < deadline, f"no stable split of the partitions between two workers: {now}"
        time.sleep(0.1)


def conversation_on(partitions: set[int], n: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(10_000) if conversation_partition(T, f"{prefix}{i}", n) in partitions)


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[float, Any]:
    t0 = time.monotonic()
    out = fn(*args, **kw)
    return time.monotonic() - t0, out


def test_a_stalled_partition_does_not_hold_the_fresh_reads_of_other_conversations(cluster: Cluster) -> None:
    rt = cluster.runtimes[0]
    held = holdings(rt, cluster)
    a = conversation_on(held["worker"], rt.partitions, "a")  # its worker will be paused
    b = conversation_on(held["worker-2"], rt.partitions, "b")
    pa, pb = scope(rt, T, a), scope(rt, T, b)
    assert pa in held["worker"] and pb in held["worker-2"]
    for cid in (a, b):
        rt.app.create_conversation(T, cid, cid, ["ann", "bob"])
        rt.app.send_message(T, cid, sender="ann", text=f"{cid} one")
    cluster.settle(rt)
    http = Http(rt)
    try:
        cluster.pause("worker")
        sent_a = rt.app.send_message(T, a, sender="ann", text=f"{a} two")
        sent_b = rt.app.send_message(T, b, sender="ann", text=f"{b} two")
        at_a, at_b = sent_a["position"], sent_b["position"]
        assert at_b > at_a

        # B's reads at B's position: B's partition holds it within moments
        took, (status, head) = timed(http.get, f"/conversations/{b}", min_position=at_b)
        assert status == 200 and head["latest_conversation_seq"] == 2, head
        assert took < 2.5, f"the head of {b} took {took:.1f} s"  # the worker projecting B's send, then one tick
        took, (status, record) = timed(http.get, f"/conversations/{b}/messages/2/delivery", min_position=at_b)
        assert status == 200 and record["state"] == "materialized", record
        assert took < 1.0, took
        took, (status, page) = timed(
            http.get, f"/me/conversations/{b}/messages", role="user", sub="bob", after_seq=0, min_position=at_b
        )
        assert status == 200 and [m["conversation_seq"] for m in page["messages"]] == [1, 2], page
        assert took < 1.0, took
        assert delivery(rt, T, b, 2, at_b)["state"] == "materialized"
        took, _ = timed(fresh_read, rt, at_b, history, rt, T, b, "bob", 0, 10, partition=pb)
        assert took < 1.0, took
        took, rebuilt = timed(rebuild, rt, T, b, "bob")  # REBUILD waits for its own partition too
        [item] = rebuilt["sessions"]
        assert item["latest_conversation_seq"] == 2 and took < 2.0, (item, took)
        assert rt.position(pb) >= at_b > rt.position()  # the views' position is held by A's partition

        # A's read at A's position, and the reads spanning conversations, wait and give up
        took, (status, body) = timed(http.get, f"/conversations/{a}", min_position=at_a)
        assert status == 503 and body["error"] == "UNAVAILABLE", body
        assert body["details"]["partition"] == pa and body["details"]["position"] < at_a, body
        assert took >= TIMEOUT - 0.1
        status, body = http.get("/me/sessions", role="user", sub="bob", min_position=at_b)
        assert status == 503 and "partition" not in body["details"], body
        # the mailbox cursor stays at the views' position: B's second entry is not served yet
        status, box = http.get("/me/mailbox", role="user", sub="bob", after=0)
        assert status == 200
        assert (b, 2) not in {(e["conversation_id"], e["conversation_seq"]) for e in box["entries"]}, box

        cluster.resume("worker")
        took, (status, head) = timed(http.get, f"/conversations/{a}", min_position=at_a)
        assert status == 200 and head["latest_conversation_seq"] == 2, head
        status, box = http.get("/me/mailbox", role="user", sub="bob", after=0, min_position=at_b)
        assert status == 200
        assert {(a, 2), (b, 2)} <= {(e["conversation_id"], e["conversation_seq"]) for e in box["entries"]}, box
    finally:
        cluster.resume("worker")
        http.close()
