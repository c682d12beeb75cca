"""Tokens, roles and tenant isolation (invariant I): the tenant always comes from the
token, and another tenant's ids simply do not exist for you."""

from __future__ import annotations

import time

import jwt
import pytest

from fanout.security import mint_token
from tests.e2e.conftest import SECRET, Api, Server, conversation, expect


async def test_a_request_without_a_token_is_unauthenticated(api: Api) -> None:
    reply = await api.anonymous().head("anything")
    expect(reply, 401, "UNAUTHENTICATED")
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(
            mint_token(SECRET, "acme", "service", "svc", now=time.time() - 7200, ttl_seconds=60), id="expired"
        ),
        pytest.param(mint_token("another-secret-" + "y" * 40, "acme", "service", "svc"), id="forged"),
        pytest.param("not.a.jwt", id="malformed"),
        pytest.param(
            jwt.encode({"tenant": "acme", "sub": "svc", "role": "root", "exp": time.time() + 60}, SECRET, "HS256"),
            id="unknown-role",
        ),
        pytest.param(
            jwt.encode({"tenant": "acme", "sub": "svc", "role": "service"}, SECRET, "HS256"), id="without-exp"
        ),
        pytest.param(
            jwt.encode({"tenant": "acme", "sub": "svc", "role": "service", "exp": time.time() + 60}, SECRET, "HS384"),
            id="other-algorithm",
        ),
    ],
)
async def test_an_expired_forged_or_malformed_token_is_unauthenticated_and_writes_nothing(
    api: Api, server: Server, token: str
) -> None:
    before = server.written()
    expect(await api.as_token(token).create_conversation(conversation_id="never"), 401, "UNAUTHENTICATED")
    assert server.written() == before


async def test_a_user_token_cannot_call_service_or_admin_routes(api: Api, server: Server, cid: str) -> None:
    await conversation(api, "acme", cid, ["ann"])
    ann = api.user("acme", "ann")
    before = server.written()
    expect(await ann.send(cid, sender="ann", text="I am a service now"), 403, "FORBIDDEN")
    expect(await ann.head(cid), 403, "FORBIDDEN")
    expect(await ann.open_review(size_bucket="small"), 403, "FORBIDDEN")
    expect(await ann.tiers(), 403, "FORBIDDEN")
    assert server.written() == before


async def test_a_service_token_cannot_call_admin_or_user_routes(api: Api) -> None:
    svc = api.service("acme")
    expect(await svc.reviews(), 403, "FORBIDDEN")
    expect(await svc.capacity(), 403, "FORBIDDEN")
    expect(await svc.projections(), 403, "FORBIDDEN")
    expect(await svc.sessions(), 403, "FORBIDDEN")
    expect(await svc.mailbox(), 403, "FORBIDDEN")


async def test_another_tenants_service_can_neither_read_nor_write_a_conversation(
    api: Api, server: Server, cid: str
) -> None:
    acme = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await acme.send(cid, sender="ann", text="acme only"), 201)
    await acme.materialized(cid, 1)
    head_before = expect(await acme.head(cid), 200)
    before = server.written()

    globex = api.service("globex")
    expect(await globex.head(cid), 404, "NOT_FOUND")
    expect(await globex.delivery(cid, 1), 404, "NOT_FOUND")
    expect(await globex.send(cid, sender="ann", text="injected"), 404, "NOT_FOUND")
    expect(await globex.send(cid, sender="ann", text="retry", client_msg_id="x"), 404, "NOT_FOUND")
    expect(await globex.add_members(cid, ["eve"]), 404, "NOT_FOUND")
    expect(await globex.remove_member(cid, "bob"), 404, "NOT_FOUND")

    assert server.written() == before
    assert expect(await acme.head(cid), 200) == head_before


async def test_the_same_conversation_id_in_two_tenants_is_two_conversations(api: Api, cid: str) -> None:
    acme = await conversation(api, "acme", cid, ["ann"])
    globex = await conversation(api, "globex", cid, ["ann", "zed"])
    expect(await globex.send(cid, sender="zed", text="globex"), 201)
    await globex.materialized(cid, 1)
    assert expect(await acme.head(cid), 200)["latest_conversation_seq"] == 0
    assert expect(await globex.head(cid), 200)["member_count"] == 2


async def test_a_user_of_another_tenant_with_the_same_user_id_sees_nothing(api: Api, server: Server, cid: str) -> None:
    user = f"ann-{cid}"
    acme = await conversation(api, "acme", cid, [user])
    expect(await acme.send(cid, sender=user, text="secret"), 201)
    await acme.materialized(cid, 1)
    before = server.written()

    impostor = api.user("globex", user)
    assert expect(await impostor.sessions(), 200) == {"sessions": [], "big_group_heads": []}
    assert expect(await impostor.mailbox(), 200)["entries"] == []
    expect(await impostor.history(cid), 404, "NOT_FOUND")
    expect(await impostor.read(cid, 1), 404, "NOT_FOUND")
    expect(await impostor.rebuild(cid), 404, "NOT_FOUND")
    assert server.written() == before

    sessions = expect(await api.user("acme", user).sessions(), 200)["sessions"]
    assert [s["conversation_id"] for s in sessions] == [cid]
    assert sessions[0]["read_conversation_seq"] == 1  # the sender read its own message; nothing else landed


async def test_another_tenants_admin_cannot_see_or_decide_a_review(api: Api, server: Server) -> None:
    review = expect(await api.admin("acme").open_review(size_bucket="large"), 201)
    before = server.written()
    globex = api.admin("globex")
    expect(await globex.review(review["review_id"]), 404, "NOT_FOUND")
    expect(
        await globex.decide(
            review["review_id"],
            decision="enable_mention_only",
            read_diffusion_min_saving=1.0,
            read_diffusion_max_active_ratio=0.5,
        ),
        404,
        "NOT_FOUND",
    )
    ids = [r["review_id"] for r in expect(await globex.reviews(), 200)["reviews"]]
    assert review["review_id"] not in ids
    assert server.written() == before
    assert expect(await api.admin("acme").review(review["review_id"]), 200)["status"] == "open"
