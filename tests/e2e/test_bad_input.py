"""Bad input of each kind is answered by the documented error, and nothing is written."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import FAST, Api, Server, conversation, expect


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


@pytest.mark.parametrize(
    "body",
    [
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
    ],
)
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
