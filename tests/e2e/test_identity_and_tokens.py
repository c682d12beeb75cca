"""Identity (ADR-0008) over the real server: a tenant that breaks the tenant alphabet never
reaches the command side, whatever its token's signature, and a malformed token or header
is a 401 with the JSON error body, never a 500.

Tokens with bad claims are forged with the server's own secret (validly signed), since
`mint_token` refuses to mint them."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

import jwt
import pytest

from tests.e2e.conftest import SECRET, Api, ApiClient, Server, conversation, expect


def forged(claims: dict[str, Any]) -> str:
    """A token signed with the server's secret, with exactly these claims."""
    return jwt.encode(claims, SECRET, algorithm="HS256")


def signed_raw(payload: str) -> str:
    """A token signed with the server's secret whose payload is this exact JSON text
    (for values the JSON encoder of a well-behaved client would not write)."""
    header = jwt.utils.base64url_encode(b'{"alg":"HS256","typ":"JWT"}')
    body = jwt.utils.base64url_encode(payload.encode())
    signing_input = header + b"." + body
    signature = jwt.algorithms.HMACAlgorithm(jwt.algorithms.HMACAlgorithm.SHA256).sign(
        signing_input, SECRET.encode()
    )
    return (signing_input + b"." + jwt.utils.base64url_encode(signature)).decode()


def strict_json(text: str) -> Any:
    """Parse as strict JSON: no NaN/Infinity, no lone surrogate escapes."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name}")

    value = json.loads(text, parse_constant=refuse)
    json.dumps(value, allow_nan=False).encode("utf-8")  # lone surrogates fail to encode
    text.encode("utf-8")
    return value


def later() -> int:
    return int(time.time()) + 3600


def unauthenticated(reply: Any) -> None:
    expect(reply, 401, "UNAUTHENTICATED")


# -- cross-tenant writes (ADR-0008) -----------------------------------------------------


async def test_a_tenant_named_like_a_prefix_cannot_touch_another_tenants_conversation(
    api: Api, server: Server
) -> None:
    """`acme/x` + `secret` used to name the same aggregate as `acme` + `x/secret`."""
    acme = await conversation(api, "acme", "x/secret", ["ann", "bob"])
    expect(await acme.send("x%2Fsecret", sender="ann", text="for acme only"), 201)
    await acme.materialized("x%2Fsecret", 1)
    conv = server.runtime.app.conversation("acme", "x/secret")
    members_before, seq_before, version_before = dict(conv.members), conv.seq, conv.version
    before = server.written()

    svc = api.as_token(forged({"tenant": "acme/x", "sub": "svc", "role": "service", "exp": later()}))
    unauthenticated(await svc.add_members("secret", ["eve"]))
    unauthenticated(await svc.remove_member("secret", "bob"))
    unauthenticated(await svc.send("secret", sender="ann", text="injected", client_msg_id="i-1"))
    unauthenticated(await svc.head("secret"))
    unauthenticated(await svc.delivery("secret", 1))
    unauthenticated(await svc.create_conversation(conversation_id="secret"))

    ann = api.as_token(forged({"tenant": "acme/x", "sub": "ann", "role": "user", "exp": later()}))
    unauthenticated(await ann.read("secret", 1))
    unauthenticated(await ann.rebuild("secret"))
    unauthenticated(await ann.history("secret"))
    unauthenticated(await ann.sessions())
    unauthenticated(await ann.mailbox())

    admin = api.as_token(forged({"tenant": "acme/x", "sub": "ops", "role": "admin", "exp": later()}))
    unauthenticated(await admin.open_review(size_bucket="small"))
    unauthenticated(await admin.roll_back("small"))
    unauthenticated(await admin.tiers())

    sock = await ann.socket()
    frame = await sock.expect("ERROR")
    assert frame["error"] == "UNAUTHENTICATED"
    assert await sock.closed()

    assert server.written() == before
    conv = server.runtime.app.conversation("acme", "x/secret")
    assert (dict(conv.members), conv.seq, conv.version) == (members_before, seq_before, version_before)
    assert expect(await acme.head("x%2Fsecret"), 200)["latest_conversation_seq"] == 1


@pytest.mark.parametrize(
    "tenant",
    ["acme/x", "", "../acme", "a" * 65, "acme corp", "acme\n", "acmé", "-acme", ".acme", "acme\x00", "\ud800"],
    ids=["slash", "empty", "dotdot", "too-long", "space", "newline", "non-ascii", "dash-first", "dot-first", "nul",
         "surrogate"],
)  # fmt: skip
async def test_a_validly_signed_token_with_a_tenant_outside_the_alphabet_is_unauthenticated(
    api: Api, server: Server, tenant: str
) -> None:
    before = server.written()
    reply = await api.as_token(forged({"tenant": tenant, "sub": "svc", "role": "service", "exp": later()})).call(
        "POST", "/v1/conversations", {"conversation_id": "never"}
    )
    unauthenticated(reply)
    assert "tenant" in reply.body["message"]
    assert server.written() == before


async def test_a_tenant_of_the_alphabet_at_its_longest_works(api: Api) -> None:
    tenant = "A" + "z0._-" * 12 + "abc"  # 64 characters
    assert len(tenant) == 64
    svc = await conversation(api, tenant, "general", ["ann"])
    assert expect(await svc.head("general"), 200)["member_count"] == 1


# -- tokens (ADR-0008) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "exp",
    ['"9999999999"', "1e300", "true", "false", "9999999999.5", "Infinity", "NaN", "-Infinity", "null", "[1]",
     "99999999999999999999999999"],
)  # fmt: skip
async def test_an_exp_that_is_not_an_integer_time_is_unauthenticated(api: Api, server: Server, exp: str) -> None:
    token = signed_raw(f'{{"tenant":"acme","sub":"svc","role":"service","exp":{exp}}}')
    before = server.written()
    reply = await api.as_token(token).call("POST", "/v1/conversations", {"conversation_id": "never"})
    unauthenticated(reply)
    assert server.written() == before


@pytest.mark.parametrize("claim", ["iat", "nbf"])
@pytest.mark.parametrize("value", ['"0"', "1e300", "Infinity", "NaN", "true"])
async def test_iat_and_nbf_that_are_not_integer_times_are_unauthenticated(api: Api, claim: str, value: str) -> None:
    token = signed_raw(f'{{"tenant":"acme","sub":"svc","role":"service","exp":{later()},"{claim}":{value}}}')
    unauthenticated(await api.as_token(token).head("anything"))


@pytest.mark.parametrize(
    "sub",
    ["\ud800", "ann\udfff", "ann\x00", "ann\n", "", "x" * 129, 7, None, ["ann"]],
    ids=["surrogate", "trailing-surrogate", "nul", "newline", "empty", "too-long", "int", "null", "list"],
)
async def test_a_sub_that_is_not_a_valid_user_id_is_unauthenticated_on_me_routes(api: Api, sub: Any) -> None:
    user = api.as_token(forged({"tenant": "acme", "sub": sub, "role": "user", "exp": later()}))
    for reply in (await user.sessions(), await user.mailbox(), await user.read("c", 0), await user.rebuild("c")):
        unauthenticated(reply)
        assert "sub" in reply.body["message"].lower()


async def raw_request(server: Server, path: str, authorization: bytes) -> tuple[int, str]:
    """One request with an Authorization header of exactly these bytes (a client library
    would refuse to send some of them)."""
    url = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nAuthorization: " + authorization
            + b"\r\nConnection: close\r\n\r\n"
        )  # fmt: skip
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode("utf-8")


@pytest.mark.parametrize(
    "authorization",
    [
        b"Bearer \xff\xfe\xfd",
        b"Bearer eyJ\xc3\xa9.abc.def",
        "Bearer jeton-\u00e9t\u00e9".encode(),
        b"Bearer \xed\xa0\x80",  # a UTF-8-encoded surrogate
        b"Bearer \x80",
        "B\u00e9arer abc".encode(),
    ],
    ids=["latin1", "utf8-in-token", "utf8-word", "encoded-surrogate", "continuation-byte", "non-ascii-scheme"],
)
@pytest.mark.parametrize("path", ["/v1/me/sessions", "/v1/conversations/general", "/v1/admin/tiers"])
async def test_an_authorization_header_with_non_ascii_bytes_is_unauthenticated_json(
    server: Server, authorization: bytes, path: str
) -> None:
    status, text = await raw_request(server, path, authorization)
    assert status == 401, text
    body = strict_json(text)
    assert body["error"] == "UNAUTHENTICATED" and set(body) == {"error", "message", "details"}


async def test_a_websocket_auth_with_a_non_ascii_token_is_an_error_frame(api: Api) -> None:
    sock = await ApiClient(api.session, api.server.url, "jeton-\u00e9t\u00e9\ud800").socket(auth=False)
    await sock.ws.send_str('{"type": "AUTH", "token": "jeton-\\u00e9t\\u00e9\\ud800"}')
    frame = await sock.expect("ERROR")
    assert frame["error"] == "UNAUTHENTICATED"
    assert await sock.closed()


async def test_bad_tokens_answer_strict_json(api: Api, server: Server) -> None:
    for token in (
        forged({"tenant": "acme", "sub": "\ud800", "role": "user", "exp": later()}),
        forged({"tenant": "\udfff", "sub": "ann", "role": "user", "exp": later()}),
        signed_raw('{"tenant":"acme","sub":"ann","role":"user","exp":1e300}'),
    ):
        async with api.session.get(
            server.url + "/v1/me/sessions", headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            assert resp.status == 401
            strict_json(await resp.text())
