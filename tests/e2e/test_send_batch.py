"""`POST /v1/messages/batch` (ADR-0024): a service's sends in one request, each a send of its
own with its own result, in order; idempotent per client_msg_id; a body that does not
validate writes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

from api.schemas import MAX_BATCH
from domain.params import Rate
from tests.e2e.conftest import FAST, Api, ApiClient, Reply, Server, conversation, expect

# At most 2 sends per sender and conversation a minute: the tests below send fewer, except
# the one about the gate.
PARAMS = dataclasses.replace(FAST, per_sender_in_conversation_rate=Rate(2, 60.0))


async def batch(svc: ApiClient, messages: list[dict[str, Any]]) -> Reply:
    return await svc.call("POST", "/v1/messages/batch", {"messages": messages})


async def test_a_batch_sends_each_message_in_order_to_its_conversation(api: Api, cid: str) -> None:
    other = cid + "-b"
    svc = await conversation(api, "acme", cid, ["ann", "bob", "cat"])
    await conversation(api, "acme", other, ["ann", "dan"])
    reply = await batch(
        svc,
        [
            {"conversation_id": cid, "sender": "ann", "text": "one"},
            {"conversation_id": other, "sender": "dan", "text": "two @ann", "mentions": ["ann"]},
            {"conversation_id": cid, "sender": "bob", "text": "three"},
        ],
    )
    body = expect(reply, 200)
    results = body["results"]
    assert [r["status"] for r in results] == [201, 201, 201]
    assert [r["conversation_seq"] for r in results] == [1, 1, 2]
    for r in results:
        assert set(r) == {"status", "conversation_seq", "message_id", "write_policy", "position"}
    positions = [r["position"] for r in results]
    assert positions == sorted(positions) and len(set(positions)) == 3
    assert body["position"] == positions[-1] == int(reply.headers["X-Fanout-Position"])

    # Each is a send like any other: materialized for every member, heads moved.
    assert (await svc.materialized(cid, 2))["mailbox_entries"] == 3
    record = await svc.materialized(other, 1)
    assert record["mailbox_entries"] == 2 and record["message_id"] == results[1]["message_id"]
    head = expect(await svc.call("GET", f"/v1/conversations/{cid}", params={"min_position": body["position"]}), 200)
    assert head["latest_conversation_seq"] == 2 and head["last_activity_id"] == results[2]["message_id"]


async def test_a_refused_message_writes_nothing_and_does_not_stop_the_others(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    reply = await batch(
        svc,
        [
            {"conversation_id": cid, "sender": "mallory", "text": "not a member"},
            {"conversation_id": cid + "-missing", "sender": "ann", "text": "no such conversation"},
            {"conversation_id": cid, "sender": "ann", "text": "fine"},
            {"conversation_id": cid, "sender": "ann", "text": "x" * (FAST.max_text_length + 1)},
        ],
    )
    results = expect(reply, 200)["results"]
    assert [(r["status"], r.get("error")) for r in results] == [
        (403, "NOT_A_MEMBER"),
        (404, "NOT_FOUND"),
        (201, None),
        (400, "INVALID_ARGUMENT"),
    ]
    for refused in (results[0], results[1], results[3]):
        assert set(refused) == {"status", "error", "message", "details"}
        assert isinstance(refused["message"], str) and isinstance(refused["details"], dict)
    assert results[2]["conversation_seq"] == 1

    # All refused: the answer's position is the log's, and nothing is written.
    before = server.written()
    reply = await batch(svc, [{"conversation_id": cid, "sender": "mallory", "text": "again"}])
    body = expect(reply, 200)
    assert body["results"][0]["error"] == "NOT_A_MEMBER"
    assert body["position"] == before == server.written()
    await svc.materialized(cid, 1)
    assert expect(await svc.head(cid), 200)["latest_conversation_seq"] == 1


async def test_a_retried_batch_answers_the_same_seqs_and_writes_nothing(api: Api, server: Server, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    messages = [
        {"conversation_id": cid, "sender": "ann", "text": "once", "client_msg_id": "k-1"},
        {"conversation_id": cid, "sender": "bob", "text": "twice", "client_msg_id": "k-2"},
    ]
    first = expect(await batch(svc, messages), 200)["results"]
    assert [r["status"] for r in first] == [201, 201]
    before = server.written()

    again = expect(await batch(svc, [*messages, {"conversation_id": cid, "sender": "ann", "text": "new"}]), 200)
    retried = again["results"]
    assert [r["status"] for r in retried] == [200, 200, 201]
    for a, b in zip(first, retried[:2], strict=True):
        assert (a["conversation_seq"], a["message_id"]) == (b["conversation_seq"], b["message_id"])
    assert retried[2]["conversation_seq"] == 3
    assert server.written() > before  # the third only

    # The single send's client_msg_id is the same one: a retry there is a duplicate too.
    single = expect(await svc.send(cid, sender="ann", text="once", client_msg_id="k-1"), 200)
    assert single["message_id"] == first[0]["message_id"]


async def test_each_message_passes_the_admission_gates_on_its_own(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    results = expect(
        await batch(svc, [{"conversation_id": cid, "sender": "ann", "text": f"m{i}"} for i in range(3)]
        + [{"conversation_id": cid, "sender": "bob", "text": "bob's"}]),
        200,
    )["results"]  # fmt: skip
    assert [r["status"] for r in results] == [201, 201, 429, 201]
    assert results[2]["error"] == "RATE_LIMITED"
    assert results[2]["details"]["gate"] == "per_sender_in_conversation_rate"
    assert results[2]["details"]["retry_after_ms"] > 0
    assert [r.get("conversation_seq") for r in results] == [1, 2, None, 3]

    metrics = expect(await api.anonymous().call("GET", "/metrics"), 200)
    m = re.search(
        r'^fanout_admission_rejections_total{gate="per_sender_in_conversation_rate",reason="RATE_LIMITED"} (\S+)$',
        metrics,
        re.M,
    )
    assert m is not None and float(m.group(1)) >= 1


async def test_a_batch_that_does_not_validate_is_refused_whole_and_writes_nothing(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, "acme", cid, ["ann"])
    ok = {"conversation_id": cid, "sender": "ann", "text": "fine"}
    before = server.written()
    bad_bodies: list[Any] = [
        {"messages": []},
        {"messages": [ok] * (MAX_BATCH + 1)},
        {"messages": [ok, {"sender": "ann", "text": "no conversation_id"}]},
        {"messages": [ok, {**ok, "colour": "red"}]},
        {"messages": [ok, {**ok, "text": 7}]},
        {"messages": ok},
        [ok],
    ]
    for body in bad_bodies:
        reply = await svc.call("POST", "/v1/messages/batch", body)
        expect(reply, 400, "INVALID_ARGUMENT")
    assert server.written() == before


async def test_only_a_service_or_admin_token_may_send_a_batch(api: Api, cid: str) -> None:
    await conversation(api, "acme", cid, ["ann"])
    message = {"conversation_id": cid, "sender": "ann", "text": "hi"}
    expect(await batch(api.user("acme", "ann"), [message]), 403, "FORBIDDEN")
    expect(await batch(api.anonymous(), [message]), 401, "UNAUTHENTICATED")
    assert expect(await batch(api.admin("acme"), [message]), 200)["results"][0]["status"] == 201


async def test_the_openapi_document_describes_the_batch_and_its_results(api: Api) -> None:
    doc = expect(await api.anonymous().call("GET", "/v1/openapi.json"), 200)
    op = doc["paths"]["/v1/messages/batch"]["post"]
    assert op["x-roles"] == ["admin", "service"]
    assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/SendBatch"}
    assert set(op["responses"]) == {"200", "400", "401", "403", "413", "500", "503"}
    assert "X-Fanout-Position" in op["responses"]["200"]["headers"]
    batch_schema = doc["components"]["schemas"]["SendBatch"]["properties"]["messages"]
    assert batch_schema["maxItems"] == MAX_BATCH and batch_schema["minItems"] == 1
    assert {"BatchResult", "BatchSent", "BatchRefused", "BatchedMessage"} <= set(doc["components"]["schemas"])


def series(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


async def test_a_batch_is_written_in_one_event_store_transaction(api: Api, cid: str) -> None:
    """ADR-0030: the batch's sends are grouped; /metrics counts the transaction and its sends."""
    svc = await conversation(api, "acme", cid, ["ann", "bob", "cat"])

    async def metrics() -> str:
        async with api.session.get(api.server.url + "/metrics") as resp:
            return await resp.text()

    before = await metrics()
    body = expect(
        await batch(svc, [{"conversation_id": cid, "sender": s, "text": f"from {s}"} for s in ("ann", "bob", "cat")]),
        200,
    )
    assert [r["status"] for r in body["results"]] == [201, 201, 201]
    after = await metrics()
    assert series(after, "fanout_group_commits_total") - series(before, "fanout_group_commits_total") >= 1
    assert series(after, "fanout_grouped_commands_total") - series(before, "fanout_grouped_commands_total") >= 3


async def test_batches_and_single_sends_racing_each_get_their_positions(api: Api, cid: str) -> None:
    """Concurrent requests share the command lane's runs (ADR-0024, ADR-0030): a batch taken
    in a run with other sends is written in the run's group, and every send still answers
    with the position it was written at (a batch grouped inside a group answered 500 once)."""
    senders = [f"s{i}" for i in range(8)]
    cids = [f"{cid}-{k}" for k in range(4)]
    svc = await conversation(api, "acme", cids[0], senders)
    for c in cids[1:]:
        await conversation(api, "acme", c, senders)
    # batch b sends as senders[b] into every conversation; single send i as senders[i] into
    # cids[0] with a client_msg_id (each sender once per conversation: under the rate gate)
    batches = [
        batch(svc, [{"conversation_id": c, "sender": senders[b], "text": f"b{b} to {c}"} for c in cids[1:]])
        for b in range(8)
    ]
    singles = [svc.send(cids[0], sender=s, text=f"single {s}", client_msg_id=f"one-{s}") for s in senders]
    replies = await asyncio.gather(*(x for pair in zip(batches, singles, strict=True) for x in pair))
    positions: list[int] = []
    for reply in replies[0::2]:
        body = expect(reply, 200)
        assert [r["status"] for r in body["results"]] == [201, 201, 201], body
        mine = [r["position"] for r in body["results"]]
        assert body["position"] == max(mine) == int(reply.headers["X-Fanout-Position"])
        positions += mine
    for reply in replies[1::2]:
        positions.append(expect(reply, 201)["position"])
    assert len(set(positions)) == len(positions) == 32
    for c in cids[1:]:
        assert (await svc.materialized(c, 8))["mailbox_entries"] == 8
