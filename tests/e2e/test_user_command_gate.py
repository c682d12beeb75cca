"""The per-user gate for user commands (ADR-0009): MARK_READ and REBUILD of one user share
one token bucket over HTTP and the WebSocket; over it, RATE_LIMITED with a retry hint and
gate per_user_command_rate. A MARK_READ that changes nothing is coalesced: no event, no
token, answered even when the bucket is empty."""

from __future__ import annotations

import asyncio
import dataclasses
import re

from domain.params import Parameters, Rate
from tests.e2e.conftest import FAST, Api, Server, conversation, expect

T = "gated"
# A burst of 2 and one more per hour: deterministic within a test, whatever the machine's speed.
PARAMS: Parameters = dataclasses.replace(FAST, per_user_command_rate=Rate(1, 3600.0), per_user_command_burst=2.0)


def rejections(metrics: str) -> float:
    m = re.search(
        r'^fanout_admission_rejections_total{gate="per_user_command_rate",reason="RATE_LIMITED"} (\S+)$', metrics, re.M
    )
    return float(m.group(1)) if m else 0.0


async def test_user_commands_past_the_burst_are_rate_limited_and_no_op_mark_reads_pass_uncharged(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, T, cid, ["ann", "bob"])
    bob, ann = api.user(T, "bob"), api.user(T, "ann")
    for i in range(2):
        expect(await svc.send(cid, sender="ann", text=f"m{i}"), 201)

    first = expect(await bob.read(cid, 1), 200)  # token 1 of 2
    assert first["coalesced"] is False
    # Once the views hold it, the same MARK_READ changes nothing: no event, no token.
    expect(await bob.call("GET", "/v1/me/sessions", params={"min_position": first["position"]}), 200)
    # bob's first read refreshed his activity, appended by the application's background
    # flush within ACTIVITY_FLUSH_INTERVAL (ADR-0018): append it now, or it may land between
    # the two written() below (seen on the distributed runtime, whose fresh read takes longer)
    await asyncio.get_running_loop().run_in_executor(None, server.runtime.app.flush_activity)
    written = server.written()
    again = await bob.read(cid, 1)
    assert expect(again, 200) == {
        "conversation_id": cid,
        "read_seq": 1,
        "coalesced": True,
        "position": again.body["position"],
    }
    assert (
        again.headers["X-Fanout-Position"] == str(again.body["position"])
        and again.body["position"] >= first["position"]
    )
    assert server.written() == written

    expect(await bob.rebuild(cid), 200)  # token 2 of 2
    written = server.written()
    refused = await bob.rebuild(cid)
    body = expect(refused, 429, "RATE_LIMITED")
    assert body["details"]["gate"] == "per_user_command_rate"
    assert body["details"]["retry_after_ms"] > 0 and int(refused.headers["Retry-After"]) >= 1
    body = expect(await bob.read(cid, 2), 429, "RATE_LIMITED")  # moves the read seq: charged, refused
    assert body["details"]["gate"] == "per_user_command_rate"
    assert server.written() == written  # refused commands write nothing

    assert expect(await bob.read(cid, 0), 200)["coalesced"] is True  # a no-op still passes
    expect(await ann.rebuild(cid), 200)  # another user has a bucket of its own

    sock = await bob.socket()
    await sock.expect("AUTH_OK")
    await sock.session_list()
    await sock.send(type="REBUILD", conversation_id=cid)
    error = await sock.expect_live("ERROR", cid, 3)  # past a late push of m0 or m1, which the list showed
    assert error["error"] == "RATE_LIMITED" and error["details"]["gate"] == "per_user_command_rate"
    await sock.send(type="MARK_READ", conversation_id=cid, read_seq=1)
    read = await sock.expect_live("READ_OK", cid, 3)
    assert read["coalesced"] is True and read["read_seq"] == 1
    await sock.close()
    assert server.written() == written + 1  # ann's REBUILD only

    async with api.session.get(server.url + "/metrics") as resp:
        assert rejections(await resp.text()) >= 3
