"""The user side of the SDK against a real `fanout serve`: the client rule from an empty
state and from a stored one, de-duplication, a dropped socket, a restarted server, an
expired token, MARK_READ and a silent member of a mention_only conversation."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from fanout_client import AuthenticationFailed, MemoryStore, UserClient
from fanout_client.core import Deliver
from fanout_client.models import Message

from fanout.security import mint_token
from tests.clients.conftest import ServeProcess
from tests.e2e.conftest import SECRET, Api, conversation, expect, quiet_group_with_review_enabled


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def user_token(tenant: str, user: str, **kw: Any) -> str:
    return mint_token(SECRET, tenant, "user", user, **kw)


class Inbox:
    """What the SDK delivered to the app, in order."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, m: Message) -> None:
        self.messages.append(m)

    def seqs(self, cid: str) -> list[int]:
        return [m.conversation_seq for m in self.messages if m.conversation_id == cid]


async def until(probe: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


async def send_many(api: Api, tenant: str, cid: str, sender: str, n: int, **body: Any) -> int:
    svc = api.service(tenant)
    seq = 0
    for i in range(n):
        seq = expect(await svc.send(cid, sender=sender, text=f"m{i}", **body), 201)["conversation_seq"]
    await svc.materialized(cid, seq)
    return seq


async def test_catch_up_from_an_empty_state_holds_every_seq_with_the_servers_counts(api: Api) -> None:
    tenant, cid = fresh("t"), fresh("c")
    svc = await conversation(api, tenant, cid, ["ann", "bob"])
    await send_many(api, tenant, cid, "ann", 4)
    expect(await svc.send(cid, sender="ann", text="hi @bob", mentions=["bob"]), 201)
    await svc.materialized(cid, 5)

    async with UserClient(api.server.url, user_token(tenant, "bob"), MemoryStore()) as client:
        state = await client.wait_caught_up()
    assert state.lines() == [
        {"conversation_id": cid, "latest_seq": 5, "read_seq": 0, "unread": 5, "unread_exact": True, "mentions": 1,
         "write_policy": "always", "held": [[1, 5]], "gaps": []}
    ]  # fmt: skip
    assert state.cursor > 0 and (state.tenant, state.user_id) == (tenant, "bob")


async def test_offline_through_n_messages_then_back_leaves_no_gap(api: Api) -> None:
    """Invariant G: a client that was away resumes from its stored cursor and holds everything."""
    tenant, cid, other = fresh("t"), fresh("c"), fresh("c")
    await conversation(api, tenant, cid, ["ann", "bob"])
    await send_many(api, tenant, cid, "ann", 3)
    store = MemoryStore()
    async with UserClient(api.server.url, user_token(tenant, "bob"), store) as client:
        await client.wait_caught_up()
        cursor = client.state.cursor
    # offline: 40 more, a reply and a new conversation bob was added to
    await send_many(api, tenant, cid, "ann", 40)
    await conversation(api, tenant, other, ["carol", "bob"])
    await send_many(api, tenant, other, "carol", 2, mention_all=True)

    async with UserClient(api.server.url, user_token(tenant, "bob"), store) as client:
        state = await client.wait_caught_up()
    assert state.cursor > cursor
    by_id = {line["conversation_id"]: line for line in state.lines()}
    assert by_id[cid]["held"] == [[1, 43]] and by_id[cid]["gaps"] == [] and by_id[cid]["unread"] == 43
    assert by_id[other]["held"] == [[1, 2]] and by_id[other]["mentions"] == 2
    assert store.load().lines() == state.lines()  # what was stored is what is shown


async def test_a_frame_received_twice_is_applied_once(api: Api) -> None:
    tenant, cid = fresh("t"), fresh("c")
    svc = await conversation(api, tenant, cid, ["ann", "bob"])
    inbox = Inbox()
    async with UserClient(api.server.url, user_token(tenant, "bob"), MemoryStore(), on_message=inbox) as client:
        await client.wait_caught_up()
        expect(await svc.send(cid, sender="ann", text="once @bob", mentions=["bob"]), 201)
        await until(lambda: inbox.seqs(cid) == [1])
        before = client.state.lines()
        frame = inbox.messages[0].model_dump()  # the real MESSAGE frame, as the server sent it
        effects = client.core.receive(frame)
        assert not [e for e in effects if isinstance(e, Deliver)]
        assert client.state.lines() == before
        assert before[0]["mentions"] == 1 and before[0]["held"] == [[1, 1]]


async def test_a_socket_dropped_mid_push_resumes_with_nothing_lost_or_repeated(api: Api) -> None:
    tenant, cid = fresh("t"), fresh("c")
    svc = await conversation(api, tenant, cid, ["ann", "bob"])
    inbox = Inbox()
    async with UserClient(api.server.url, user_token(tenant, "bob"), MemoryStore(), on_message=inbox) as client:
        await client.wait_caught_up()

        async def sender() -> None:
            for i in range(30):
                expect(await svc.send(cid, sender="ann", text=f"push {i}"), 201)

        sending = asyncio.create_task(sender())
        await until(lambda: len(inbox.seqs(cid)) >= 3)
        client.drop()  # while the rest is being sent and pushed
        await sending
        await svc.materialized(cid, 30)
        await until(lambda: client.core.caught_up and client.state.conversations[cid].latest_seq == 30)
        assert client.last_close is not None and client.last_close.code == 1006, (
            client.last_close
        )  # abnormal: no close frame
    line = client.state.lines()[0]
    assert line["held"] == [[1, 30]] and line["gaps"] == []
    assert client.connections >= 2
    assert len(inbox.seqs(cid)) == len(set(inbox.seqs(cid)))  # no body delivered twice


async def test_a_restarted_server_is_resumed_from_the_stored_state(tmp_path: Any) -> None:
    server = ServeProcess(tmp_path / "data").start()
    try:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            api = Api(session, server)  # type: ignore[arg-type]
            tenant, cid = fresh("t"), fresh("c")
            await conversation(api, tenant, cid, ["ann", "bob"])
            await send_many(api, tenant, cid, "ann", 3)
            inbox = Inbox()
            async with UserClient(server.url, user_token(tenant, "bob"), MemoryStore(), on_message=inbox) as client:
                await client.wait_caught_up()
                await asyncio.to_thread(server.restart)  # closes every socket with 1001, then serves again
                await send_many(api, tenant, cid, "ann", 4)
                await until(lambda: client.state.conversations[cid].latest_seq == 7 and client.core.caught_up)
                assert client.connections >= 2
    finally:
        server.stop()
    assert client.state.lines()[0]["held"] == [[1, 7]]


async def test_an_expired_token_is_renewed_by_the_callback_and_refused_without_one(api: Api) -> None:
    tenant, cid = fresh("t"), fresh("c")
    await conversation(api, tenant, cid, ["ann", "bob"])
    await send_many(api, tenant, cid, "ann", 2)
    expired = user_token(tenant, "bob", ttl_seconds=60, now=time.time() - 3600)
    calls: list[int] = []

    async def refresh() -> str:
        calls.append(1)
        return user_token(tenant, "bob")

    async with UserClient(api.server.url, expired, MemoryStore(), refresh_token=refresh) as client:
        state = await client.wait_caught_up()
    assert calls == [1] and state.lines()[0]["held"] == [[1, 2]]

    async with UserClient(api.server.url, expired, MemoryStore()) as client:
        with pytest.raises(AuthenticationFailed) as refused:
            await client.wait_caught_up()
    assert refused.value.code == "UNAUTHENTICATED"


async def test_mark_read_updates_the_counts_and_the_server(api: Api) -> None:
    tenant, cid = fresh("t"), fresh("c")
    svc = await conversation(api, tenant, cid, ["ann", "bob"])
    await send_many(api, tenant, cid, "ann", 3)
    expect(await svc.send(cid, sender="ann", text="@bob look", mentions=["bob"]), 201)
    await send_many(api, tenant, cid, "ann", 1)
    async with UserClient(api.server.url, user_token(tenant, "bob"), MemoryStore()) as client:
        await client.wait_caught_up()
        ok = await client.mark_read(cid, 3)
        line = client.state.lines()[0]
        assert ok.read_seq == 3 and (line["read_seq"], line["unread"], line["mentions"]) == (3, 2, 1)
        ok = await client.mark_read(cid)  # to the latest held
        line = client.state.lines()[0]
        assert ok.read_seq == 5 and (line["unread"], line["mentions"], line["unread_exact"]) == (0, 0, True)
    (item,) = expect(await api.user(tenant, "bob").call("GET", "/v1/me/sessions", params={"min_position": ok.position}), 200)["sessions"]  # fmt: skip
    assert item["read_conversation_seq"] == 5 and item["unread_count"] == 0


async def test_a_silent_member_of_a_mention_only_group_sees_an_estimate_then_exact_counts(api: Api) -> None:
    tenant, cid = fresh("t"), fresh("c")
    svc, _admin, _rid = await quiet_group_with_review_enabled(api, tenant, cid)
    for text in ("only the active", "still quiet", "@quiet3 you", "bye"):
        body: dict[str, Any] = {"mentions": ["quiet3"]} if "@" in text else {}
        sent = expect(await svc.send(cid, sender="ann", text=text, **body), 201)
        assert sent["write_policy"] == "mention_only"
    await svc.materialized(cid, 5)
    inbox = Inbox()
    async with UserClient(api.server.url, user_token(tenant, "quiet3"), MemoryStore(), on_message=inbox) as client:
        await client.wait_caught_up()
        line = client.state.lines()[0]
        assert line["write_policy"] == "mention_only" and line["unread_exact"] is False
        assert (line["unread"], line["mentions"], line["held"], line["gaps"]) == (5, 1, [[1, 5]], [])
        assert sorted(inbox.seqs(cid)) == [2, 3, 5]  # pulled: exactly the seqs the mailbox skipped
        await client.mark_read(cid)
        line = client.state.lines()[0]
        assert (line["unread"], line["unread_exact"], line["mentions"]) == (0, True, 0)
