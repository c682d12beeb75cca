"""Hostile input is a 4xx with the JSON error body, never a 500, and
everything the server emits is strict JSON (no NaN / Infinity literals).

Integers must fit SQLite's signed 64 bits; non-finite numbers are refused on input."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.e2e.conftest import Api, Server, conversation, expect

INT64_MAX = 2**63 - 1
HUGE = [2**63, 2**64, 2**70, -(2**63) - 1, 10**40]


def strict_loads(text: str | bytes) -> Any:
    """A parser that refuses NaN, Infinity and -Infinity (RFC 8259 JSON)."""

    def refuse(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


def raw_call(server: Server, method: str, path: str, body: bytes | None, token: str | None) -> tuple[int, bytes]:
    """One request with exactly these bytes (aiohttp's client would re-encode them)."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def assert_json_error(status: int, raw: bytes, expected_status: int = 400, code: str = "INVALID_ARGUMENT") -> Any:
    body = strict_loads(raw)
    assert status == expected_status, (status, body)
    assert set(body) == {"error", "message", "details"} and body["error"] == code, body
    return body


# -- integers beyond 64 bits -------------------------------------------------------


@pytest.mark.parametrize("huge", HUGE)
async def test_a_reply_to_seq_beyond_64_bits_is_invalid_argument_naming_the_field(
    api: Api, server: Server, cid: str, huge: int
) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await svc.send(cid, sender="ann", text="first"), 201)
    position = server.written()
    body = expect(await svc.send(cid, sender="ann", text="x", reply_to_seq=huge), 400, "INVALID_ARGUMENT")
    assert "reply_to_seq" in body["message"]
    assert body["details"]["errors"][0]["loc"] == ["reply_to_seq"]
    assert server.written() == position


async def test_the_largest_64_bit_reply_to_seq_is_checked_against_the_latest_seq(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await svc.send(cid, sender="ann", text="first"), 201)
    body = expect(await svc.send(cid, sender="ann", text="x", reply_to_seq=INT64_MAX), 400, "INVALID_ARGUMENT")
    assert body["details"]["field"] == "reply_to_seq" and body["details"]["latest"] == 1, body


@pytest.mark.parametrize("huge", [2**63, 2**70])
async def test_a_read_seq_beyond_64_bits_is_invalid_argument(api: Api, cid: str, huge: int) -> None:
    await conversation(api, "acme", cid, ["ann", "bob"])
    body = expect(await api.user("acme", "ann").read(cid, huge), 400, "INVALID_ARGUMENT")
    assert "read_seq" in body["message"]


@pytest.mark.parametrize("name", ["after", "limit"])
async def test_mailbox_query_integers_beyond_64_bits_are_invalid_argument(api: Api, name: str) -> None:
    body = expect(await api.user("acme", "ann").mailbox(**{name: str(2**70)}), 400, "INVALID_ARGUMENT")
    assert name in body["message"]


@pytest.mark.parametrize("name", ["after_seq", "limit"])
async def test_history_query_integers_beyond_64_bits_are_invalid_argument(api: Api, cid: str, name: str) -> None:
    await conversation(api, "acme", cid, ["ann", "bob"])
    body = expect(await api.user("acme", "ann").history(cid, **{name: str(2**70)}), 400, "INVALID_ARGUMENT")
    assert name in body["message"]


async def test_a_delivery_seq_beyond_64_bits_is_invalid_argument(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann"])
    body = expect(await svc.delivery(cid, str(2**70)), 400, "INVALID_ARGUMENT")
    assert body["details"]["field"] == "seq"


async def test_a_websocket_read_seq_beyond_64_bits_is_an_error_frame(api: Api, cid: str) -> None:
    # a user of this test only: a push of another test's message to "ann" may still be on its way
    # (the distributed runtime pushes after the worker's commit, through Kafka)
    ann = f"ann-{cid}"
    await conversation(api, "acme", cid, [ann, "bob"])
    sock = await api.user("acme", ann).socket()
    try:
        await sock.expect("AUTH_OK")
        await sock.session_list()
        await sock.ws.send_str(json.dumps({"type": "MARK_READ", "conversation_id": cid, "read_seq": 2**70}))
        frame = await sock.expect("ERROR")
        assert frame["error"] == "INVALID_ARGUMENT" and "read_seq" in frame["message"]
        await sock.ws.send_str('{"type": "PULL_HISTORY", "conversation_id": ' + json.dumps(cid) + ', "after_seq": NaN}')
        assert (await sock.expect("ERROR"))["error"] == "INVALID_ARGUMENT"
    finally:
        await sock.close()


# -- non-finite numbers ---------------------------------------------------------------


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999", "-1e999"])
async def test_a_decision_with_a_non_finite_parameter_is_refused_and_nothing_is_stored(
    api: Api, server: Server, literal: str
) -> None:
    admin = api.admin("acme-nonfinite")
    rid = expect(await admin.open_review(size_bucket="small"), 201)["review_id"]
    raw = (
        '{"decision": "enable_mention_only", "read_diffusion_min_saving": '
        + literal
        + ', "read_diffusion_max_active_ratio": 0.5}'
    ).encode()
    status, body = raw_call(server, "POST", f"/v1/admin/reviews/{rid}/decision", raw, admin.token)
    assert_json_error(status, body)
    review = expect(await admin.review(rid), 200)
    assert review["status"] == "open"
    status, body = raw_call(server, "GET", "/v1/admin/reviews", None, admin.token)
    assert status == 200 and strict_loads(body)["reviews"]


async def test_a_non_finite_number_anywhere_in_a_body_is_refused(api: Api, server: Server) -> None:
    admin = api.admin("acme-nonfinite")
    for literal in ("NaN", "Infinity", "-Infinity", "1e400"):
        raw = b'{"size_bucket": "small", "details": {"deep": [1, {"x": %s}]}}' % literal.encode()
        status, body = raw_call(server, "POST", "/v1/admin/reviews", raw, admin.token)
        assert_json_error(status, body)


async def test_a_stored_non_finite_value_is_a_clear_error_never_invalid_json(api: Api, server: Server) -> None:
    """A value stored before this fix (or by a bug) must not leak out as `Infinity`."""
    tenant = "acme-stored-inf"
    review = server.runtime.app.open_review(tenant, "small", "manual", {"load": float("inf")}, "ops")
    rid = review["review_id"] if isinstance(review, dict) else str(review)
    admin = api.admin(tenant)
    status, body = raw_call(server, "GET", f"/v1/admin/reviews/{rid}", None, admin.token)
    assert_json_error(status, body, 500, "INTERNAL")


# -- bodies that are not JSON text --------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"sender": "ann", "text": "\xff\xfe"}', id="invalid-utf-8"),
        pytest.param(b'{"sender": "ann", "text": "caf\xc3"}', id="truncated-utf-8"),
        pytest.param(b'{"sender": "\\ud800", "text": "x"}', id="lone-surrogate-escape"),
        pytest.param(b'{"sender": "ann", "text": "x", "mentions": ["\\udfff"]}', id="lone-surrogate-in-list"),
        pytest.param(b'{"sender": "ann", "text": NaN}', id="nan-literal"),
        pytest.param(b"\x00\x01", id="binary"),
        pytest.param(b'{"sender": "ann", "text": "x"} trailing', id="trailing-garbage"),
        pytest.param(b'{"sender": "ann", "sender": "bob", "text": "x"}', id="duplicate-key"),
    ],
)
async def test_a_send_body_that_is_not_strict_json_text_is_invalid_argument(
    api: Api, server: Server, cid: str, raw: bytes
) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    position = server.written()
    status, body = raw_call(server, "POST", f"/v1/conversations/{cid}/messages", raw, svc.token)
    assert_json_error(status, body)
    assert server.written() == position


# -- GET /v1/ws without an upgrade ---------------------------------------------------------


async def test_get_ws_without_an_upgrade_is_a_json_error(api: Api, server: Server) -> None:
    async with aiohttp.ClientSession() as session, session.get(server.url + "/v1/ws") as resp:
        status, raw = resp.status, await resp.read()
    body = assert_json_error(status, raw, 426)
    assert "Upgrade" in body["message"] or "upgrade" in body["message"]


async def test_openapi_states_the_rules_the_server_enforces(api: Api, server: Server) -> None:
    status, raw = raw_call(server, "GET", "/v1/openapi.json", None, None)
    doc = strict_loads(raw)
    schemas = doc["components"]["schemas"]
    send = schemas["SendMessage"]["properties"]
    assert send["reply_to_seq"]["anyOf"][0]["maximum"] == INT64_MAX
    assert send["reply_to_seq"]["anyOf"][0]["minimum"] == 1
    assert send["sender"]["maxLength"] == 128 and send["sender"]["minLength"] == 1
    assert "control" in send["sender"]["description"]
    assert "max_text_length" in send["text"]["description"]
    assert schemas["MarkRead"]["properties"]["read_seq"]["maximum"] == INT64_MAX
    assert "latest" in schemas["MarkRead"]["properties"]["read_seq"]["description"]
    mailbox = {p["name"]: p for p in doc["paths"]["/v1/me/mailbox"]["get"]["parameters"]}
    assert mailbox["limit"]["schema"]["maximum"] >= 1 and mailbox["limit"]["schema"]["minimum"] == 1
    assert mailbox["after"]["schema"]["maximum"] == INT64_MAX
    delivery = doc["paths"]["/v1/conversations/{cid}/messages/{seq}/delivery"]["get"]
    seq = next(p for p in delivery["parameters"] if p["name"] == "seq")
    assert seq["schema"]["maximum"] == INT64_MAX
    cid_param = next(p for p in delivery["parameters"] if p["name"] == "cid")
    assert cid_param["schema"]["maxLength"] == 128
    ws = doc["paths"]["/v1/ws"]["get"]
    assert "101" in ws["responses"] and "426" in ws["responses"]
    assert "Upgrade" in ws["description"]
    decide = schemas["DecideReview"]["properties"]["read_diffusion_min_saving"]
    assert "finite" in json.dumps(decide)
