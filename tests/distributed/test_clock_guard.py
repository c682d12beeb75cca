"""An API replica whose clock is off the event store's refuses the writes it would stamp
(ADR-0041), on the real engines: PostgreSQL's clock is the reference every replica measures
its own against; Kafka and Cassandra because a replica needs them to start. Over HTTP, as a
service sees it: 503 UNAVAILABLE `clock_skew` with Retry-After and nothing written, /readyz
not ready, the skew in /metrics; the replica on the right clock accepts the same send; once
the clock is put right the next measurement lets the skewed one write again."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from api.app import create_app
from fanout.bootstrap.replica import bootstrap_distributed
from fanout.config import load_settings
from fanout.distributed import DistributedRuntime
from fanout.security import mint_token
from tests.distributed.cluster import Cluster, running_cluster

T = "acme"
SECRET = "clock-guard-" + "x" * 40


@pytest.fixture
def cluster(fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(fresh_postgres, fresh_kafka, fresh_cassandra, tmp_path / "logs") as c:
        yield c


Reply = tuple[int, Any, dict[str, str]]  # status, the body (JSON parsed, else text), headers


def over_http(rt: DistributedRuntime, calls: list[tuple[str, str, dict[str, Any] | None]]) -> list[Reply]:
    """Each (method, path, body) through the replica's API."""

    async def run() -> list[Reply]:
        client = TestClient(TestServer(create_app(rt, SECRET)))
        await client.start_server()
        headers = {"Authorization": f"Bearer {mint_token(SECRET, T, 'service', 'svc')}"}
        out: list[Reply] = []
        try:
            for method, path, body in calls:
                resp = await client.request(method, path, json=body, headers=headers)
                text = await resp.text()
                parsed = json.loads(text) if resp.content_type == "application/json" else text
                out.append((resp.status, parsed, dict(resp.headers)))
        finally:
            await client.close()
        return out

    return asyncio.run(run())


def test_a_replica_whose_clock_is_off_refuses_the_writes_it_would_stamp(cluster: Cluster) -> None:
    right = cluster.runtimes[0]
    assert right.clock_guard is not None
    skew = right.clock_guard.measure()
    assert skew is not None and abs(skew) < 1.0  # the same host: PostgreSQL's clock is this one
    right.app.create_conversation(T, "g", "general", ["a", "b"])

    offset = [7200.0]  # two hours ahead: its messages would be filed under hours no read looks in yet
    env = {**cluster.urls, **cluster.settings_env}
    ahead = bootstrap_distributed(load_settings(env), clock=lambda: time.time() + offset[0]).start()
    cluster.runtimes.append(ahead)  # closed with the cluster
    written = right.app.log_position()

    send = ("POST", "/v1/conversations/g/messages", {"sender": "a", "text": "what time is it?"})
    [(status, body, headers), (ready_status, ready, _), (_, metrics, _)] = over_http(
        ahead, [send, ("GET", "/readyz", None), ("GET", "/metrics", None)]
    )
    assert status == 503 and body["error"] == "UNAVAILABLE", body
    details = body["details"]
    assert details["reason"] == "clock_skew" and 7190 < details["clock_skew_seconds"] < 7210, body
    assert int(headers["Retry-After"]) >= 1
    assert "ahead of the event store's" in body["message"] and "FANOUT_MAX_CLOCK_SKEW" in body["message"]
    assert right.app.log_position() == written  # nothing written
    assert ready_status == 503 and ready["status"] == "not_ready" and set(ready["errors"]) == {"clock"}, ready
    assert 7190 < ready["clock_skew_seconds"] < 7210
    assert "\nfanout_clock_skew_refusals_total 1.0" in metrics
    line = next(x for x in metrics.splitlines() if x.startswith("fanout_clock_skew_seconds "))
    assert 7190 < float(line.split()[1]) < 7210

    [(status, body, _)] = over_http(right, [send])
    assert status == 201, body  # the replica on the store's clock takes the same send

    offset[0] = 0.0  # NTP put the clock right: the next health check measures it
    ahead.check()
    [(status, body, _)] = over_http(ahead, [send])
    assert status == 201, body
    assert body["conversation_seq"] == 2
