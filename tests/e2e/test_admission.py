"""Admission gates with the ADR's default rates: a rejection is explicit (RATE_LIMITED /
FANOUT_QUOTA_EXCEEDED with Retry-After), writes nothing, and is counted in /metrics."""

from __future__ import annotations

import dataclasses
import re

from domain.params import Parameters
from tests.e2e.conftest import Api, Server, conversation, expect

# Default rates (1 msg / 3 s per sender); a tiny tenant fan-out quota for tenant "thrifty".
PARAMS = dataclasses.replace(
    Parameters(), max_group_members=50, tenant_fanout_quota_capacity=5, tenant_fanout_quota_refill_per_sec=0.5
)


def rejections(metrics: str, reason: str, gate: str) -> float:
    m = re.search(rf'^fanout_admission_rejections_total{{gate="{gate}",reason="{reason}"}} (\S+)$', metrics, re.M)
    return float(m.group(1)) if m else 0.0


async def test_a_second_send_within_three_seconds_is_rate_limited_with_a_retry_hint(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await svc.send(cid, sender="ann", text="first"), 201)
    before = server.written()

    reply = await svc.send(cid, sender="ann", text="too soon")
    body = expect(reply, 429, "RATE_LIMITED")
    assert body["details"]["gate"] == "per_sender_in_conversation_rate"
    assert 0 < body["details"]["retry_after_ms"] <= 3000
    assert 1 <= int(reply.headers["Retry-After"]) <= 3
    assert server.written() == before

    # Another sender has its own bucket: admitted.
    assert expect(await svc.send(cid, sender="bob", text="my turn"), 201)["conversation_seq"] == 2
    await svc.materialized(cid, 2)
    assert expect(await svc.head(cid), 200)["latest_conversation_seq"] == 2

    metrics = expect(await api.anonymous().call("GET", "/metrics"), 200)
    assert rejections(metrics, "RATE_LIMITED", "per_sender_in_conversation_rate") >= 1


async def test_a_send_over_the_tenant_fanout_quota_is_rejected_with_a_retry_hint(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, "thrifty", cid, ["ann", "bob", "cat", "dan"])
    expect(await svc.send(cid, sender="ann", text="4 entries of 5"), 201)
    before = server.written()

    reply = await svc.send(cid, sender="bob", text="4 more")
    body = expect(reply, 429, "FANOUT_QUOTA_EXCEEDED")
    assert body["details"]["gate"] == "tenant_fanout_quota" and body["details"]["entries"] == 4
    assert body["details"]["retry_after_ms"] > 0
    assert int(reply.headers["Retry-After"]) >= 1
    assert server.written() == before

    metrics = expect(await api.anonymous().call("GET", "/metrics"), 200)
    assert rejections(metrics, "FANOUT_QUOTA_EXCEEDED", "tenant_fanout_quota") == 1
