"""Bad input of each kind is answered by the documented error, and nothing is written.

`BAD_REQUESTS` lists the cases as data (answered on each runtime here, and compared across
the embedded runtime and two distributed replicas by tests/e2e/test_replicas.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.conftest import FAST, Api, Reply, Server, conversation, expect

NO_BODY: Any = object()


@dataclass(frozen=True)
class Bad:
    """A request to the conversation {cid} (members ann and bob, one message) that must be
    refused with `status` / `error` and write nothing. `role` service is the tenant's
    service, user is bob."""

    id: str
    method: str
    path: str
    status: int = 400
    error: str = "INVALID_ARGUMENT"
    role: str = "service"
    json: Any = NO_BODY
    data: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    async def answer(self, api: Api, cid: str, tenant: str = "acme") -> Reply:
        client = api.service(tenant) if self.role == "service" else api.user(tenant, "bob")
        path = self.path.format(cid=cid)
        if self.json is not NO_BODY:
            return await client.call(self.method, path, self.json, params=self.params or None)
        return await client.call(self.method, path, data=self.data, params=self.params or None)


SEND = "/v1/conversations/{cid}/messages"
SEND_BODIES = [
    pytest.param({"sender": "ann", "text": 5}, id="text-not-a-string"),
    pytest.param({"sender": 7, "text": "x"}, id="sender-not-a-string"),
    pytest.param({"sender": "ann", "text": "x", "mention_all": "yes"}, id="bool-as-string"),
    pytest.param({"sender": "ann", "text": "x", "mention_all": 1}, id="bool-as-int"),
    pytest.param({"sender": "ann", "text": "x", "reply_to_seq": "1"}, id="seq-as-string"),
    pytest.param({"sender": "ann", "text": "x", "reply_to_seq": 1.5}, id="seq-as-float"),
    pytest.param({"sender": "ann", "text": "x", "mentions": "bob"}, id="mentions-not-a-list"),
    pytest.param({"sender": "ann", "text": "x", "colour": "red"}, id="unknown-field"),
    pytest.param({"text": "x"}, id="missing-sender"),
    pytest.param({"sender": "", "text": "x"}, id="empty-sender"),
    pytest.param({"sender": "ann", "text": "x", "client_msg_id": "k" * 129}, id="client-msg-id-too-long"),
]
MALFORMED_JSON = ['{"sender": "ann", "text": ', "not json", "[1, 2]", '"a string"']
MEMBERS = "/v1/conversations/{cid}/members"
BAD_REQUESTS: list[Bad] = [
    *(Bad(f"malformed-{i}", "POST", SEND, data=raw) for i, raw in enumerate(MALFORMED_JSON)),
    *(Bad(f"send-{p.id}", "POST", SEND, json=p.values[0]) for p in SEND_BODIES),
    Bad("text-too-long", "POST", SEND, json={"sender": "ann", "text": "x" * (FAST.max_text_length + 1)}),
    Bad("text-empty", "POST", SEND, json={"sender": "ann", "text": ""}),
    *(
        Bad(f"reply-to-{seq}", "POST", SEND, json={"sender": "ann", "text": "x", "reply_to_seq": seq})
        for seq in (2, 0, -3)
    ),
    Bad(
        "over-a-mebibyte",
        "POST",
        SEND,
        413,
        "PAYLOAD_TOO_LARGE",
        data='{"sender": "ann", "text": "' + "x" * (1024 * 1024 + 10) + '"}',
    ),
    Bad("members-a-string", "POST", MEMBERS, json={"user_ids": "bob"}),
    Bad("members-ints", "POST", MEMBERS, json={"user_ids": [1, 2]}),
    Bad("members-empty-id", "POST", MEMBERS, json={"user_ids": [""]}),
    Bad("members-wrong-field", "POST", MEMBERS, json={"users": ["x"]}),
    Bad("create-members-a-string", "POST", "/v1/conversations", json={"conversation_id": "{cid}-x", "members": "ann"}),
    Bad("create-empty-id", "POST", "/v1/conversations", json={"conversation_id": "", "members": []}),
    *(
        Bad(f"read-{value!r}", "POST", "/v1/me/conversations/{cid}/read", role="user", json={"read_seq": value})
        for value in (-1, 2, 1000, "1", 1.0, None, True)
    ),
    *(
        Bad(f"history-{params}", "GET", "/v1/me/conversations/{cid}/messages", role="user", params=params)
        for params in ({"after_seq": -1}, {"after_seq": 2}, {"after_seq": "x"}, {"limit": 0}, {"limit": 100_000})
    ),
    *(
        Bad(f"mailbox-{params}", "GET", "/v1/me/mailbox", role="user", params=params)
        for params in ({"after": -1}, {"limit": 0}, {"limit": "many"}, {"cursor": 3})
    ),
    Bad("unknown-route", "GET", "/v1/nope", 404, "NOT_FOUND"),
    Bad("unknown-route-outside-v1", "GET", "/nope", 404, "NOT_FOUND"),
    Bad("method-not-allowed", "PUT", "/v1/conversations", 405, "NOT_FOUND"),
]


@pytest.fixture
async def ready(api: Api, server: Server, cid: str) -> tuple[Api, str, int]:
    """A conversation with one message; returns (api, cid, log position)."""
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await svc.send(cid, sender="ann", text="first"), 201)
    await svc.materialized(cid, 1)
    return api, cid, server.written()


async def assert_nothing_written(api: Api, server: Server, cid: str, log_position: int) -> None:
    assert server.written() == log_position
    head = expect(await api.service("acme").head(cid), 200)
    assert head["latest_conversation_seq"] == 1 and head["member_count"] == 2


async def test_malformed_json_is_invalid_argument(ready: tuple[Api, str, int], server: Server) -> None:
    api, cid, position = ready
    svc = api.service("acme")
    for raw in ('{"sender": "ann", "text": ', "not json", "[1, 2]", '"a string"'):
        reply = expect(await svc.call("POST", f"/v1/conversations/{cid}/messages", data=raw), 400, "INVALID_ARGUMENT")
        assert reply["details"]["errors"]
    await assert_nothing_written(api, server, cid, position)


@pytest.mark.parametrize("body", SEND_BODIES)
async def test_a_send_with_a_wrong_type_unknown_field_or_missing_field_is_invalid_argument(
    ready: tuple[Api, str, int], server: Server, body: dict[str, object]
) -> None:
    api, cid, position = ready
    reply = expect(await api.service("acme").send(cid, **body), 400, "INVALID_ARGUMENT")
    assert reply["details"]["errors"][0]["loc"]
    await assert_nothing_written(api, server, cid, position)


async def test_text_over_max_text_length_is_invalid_argument(ready: tuple[Api, str, int], server: Server) -> None:
    api, cid, position = ready
    reply = await api.service("acme").send(cid, sender="ann", text="x" * (FAST.max_text_length + 1))
    assert expect(reply, 400, "INVALID_ARGUMENT")["details"]["max_text_length"] == FAST.max_text_length
    expect(await api.service("acme").send(cid, sender="ann", text=""), 400, "INVALID_ARGUMENT")
    await assert_nothing_written(api, server, cid, position)


async def test_a_reply_to_a_future_seq_is_invalid_argument(ready: tuple[Api, str, int], server: Server) -> None:
    api, cid, position = ready
    svc = api.service("acme")
    expect(await svc.send(cid, sender="ann", text="x", reply_to_seq=2), 400, "INVALID_ARGUMENT")
    expect(await svc.send(cid, sender="ann", text="x", reply_to_seq=0), 400, "INVALID_ARGUMENT")
    expect(await svc.send(cid, sender="ann", text="x", reply_to_seq=-3), 400, "INVALID_ARGUMENT")
    await assert_nothing_written(api, server, cid, position)


async def test_a_body_over_one_mebibyte_is_payload_too_large(ready: tuple[Api, str, int], server: Server) -> None:
    api, cid, position = ready
    huge = '{"sender": "ann", "text": "' + "x" * (1024 * 1024 + 10) + '"}'
    reply = await api.service("acme").call("POST", f"/v1/conversations/{cid}/messages", data=huge)
    expect(reply, 413, "PAYLOAD_TOO_LARGE")
    await assert_nothing_written(api, server, cid, position)


async def test_bad_member_lists_are_invalid_argument(ready: tuple[Api, str, int], server: Server) -> None:
    api, cid, position = ready
    svc = api.service("acme")
    expect(await svc.add_members(cid, "bob"), 400, "INVALID_ARGUMENT")  # type: ignore[arg-type]
    expect(await svc.add_members(cid, [1, 2]), 400, "INVALID_ARGUMENT")  # type: ignore[list-item]
    expect(await svc.add_members(cid, [""]), 400, "INVALID_ARGUMENT")
    expect(await svc.call("POST", f"/v1/conversations/{cid}/members", {"users": ["x"]}), 400, "INVALID_ARGUMENT")
    expect(await svc.create_conversation(conversation_id=cid + "-x", members="ann"), 400, "INVALID_ARGUMENT")
    expect(await svc.create_conversation(conversation_id="", members=[]), 400, "INVALID_ARGUMENT")
    await assert_nothing_written(api, server, cid, position)


async def test_negative_future_and_non_numeric_seqs_from_a_user_are_invalid_argument(
    ready: tuple[Api, str, int], server: Server
) -> None:
    api, cid, position = ready
    bob = api.user("acme", "bob")
    for read_seq in (-1, 2, 1000, "1", 1.0, None, True):
        expect(await bob.read(cid, read_seq), 400, "INVALID_ARGUMENT")
    for params in ({"after_seq": -1}, {"after_seq": 2}, {"after_seq": "x"}, {"limit": 0}, {"limit": 100_000}):
        expect(await bob.history(cid, **params), 400, "INVALID_ARGUMENT")
    for params in ({"after": -1}, {"limit": 0}, {"limit": "many"}, {"cursor": 3}):
        expect(await bob.mailbox(**params), 400, "INVALID_ARGUMENT")
    await assert_nothing_written(api, server, cid, position)
    assert expect(await bob.sessions(), 200)["sessions"][0]["read_conversation_seq"] == 0


async def test_unknown_routes_and_methods_answer_in_the_error_shape(api: Api) -> None:
    svc = api.service("acme")
    expect(await svc.call("GET", "/v1/nope"), 404, "NOT_FOUND")
    expect(await svc.call("GET", "/nope"), 404, "NOT_FOUND")
    reply = await svc.call("PUT", "/v1/conversations")
    assert "POST" in expect(reply, 405, "NOT_FOUND")["details"]["allowed_methods"]
    assert "POST" in reply.headers["Allow"]


async def test_every_bad_request_of_the_table_is_answered_by_its_error_and_writes_nothing(
    ready: tuple[Api, str, int], server: Server
) -> None:
    api, cid, position = ready
    for case in BAD_REQUESTS:
        expect(await case.answer(api, cid), case.status, case.error)
    await assert_nothing_written(api, server, cid, position)
