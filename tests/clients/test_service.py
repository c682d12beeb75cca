"""The service side of the SDK against a real `fanout serve`: conversations, members, sends
and batches idempotent by client_msg_id, and retries that wait as Retry-After says and
resend the same bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fanout_client import NotAMember, ServiceClient
from fanout_client.models import BatchRefused, BatchSent

from domain.params import Rate
from fanout.security import mint_token
from tests.clients.conftest import ServeProcess
from tests.e2e.conftest import FAST, SECRET, Api, expect

# One send per sender per conversation per second: the second in a row is RATE_LIMITED.
TIGHT = dataclasses.replace(FAST, per_sender_in_conversation_rate=Rate(1, 1.0))


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path_factory.mktemp("tight") / "data", TIGHT).start()
    try:
        yield server
    finally:
        server.stop()


def service(url: str, tenant: str) -> ServiceClient:
    return ServiceClient(url, mint_token(SECRET, tenant, "service", "billing-bot"))


async def test_conversations_members_and_sends_round_trip(api: Api, served: ServeProcess) -> None:
    tenant, cid = f"t-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:6]}"
    async with service(served.url, tenant) as svc:
        created = await svc.create_conversation(cid, title="General", members=["ann"])
        assert (created.conversation_id, created.member_count) == (cid, 1)
        added = await svc.add_members(cid, ["bob", "carol", "ann"])
        assert added.member_count == 3
        removed = await svc.remove_member(cid, "carol")
        assert removed.member_count == 2

        first = await svc.send(cid, "ann", "hello @bob", mentions=["bob"], client_msg_id="hello-1")
        again = await svc.send(cid, "ann", "hello @bob", mentions=["bob"], client_msg_id="hello-1")
        assert (again.conversation_seq, again.message_id) == (first.conversation_seq, first.message_id) == (1, again.message_id)  # fmt: skip
        with pytest.raises(NotAMember):
            await svc.send(cid, "carol", "I left")
        assert (await svc.head(cid)).latest_conversation_seq == 1


async def test_a_batch_gives_each_message_an_id_so_a_resent_batch_sends_none_twice(served: ServeProcess) -> None:
    tenant, cid = f"t-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:6]}"
    async with service(served.url, tenant) as svc:
        await svc.create_conversation(cid, members=["ann", "bob"])
        messages = [
            {"conversation_id": cid, "sender": "ann", "text": "one", "client_msg_id": "b-1"},
            {"conversation_id": cid, "sender": "mallory", "text": "not a member"},
            {"conversation_id": cid, "sender": "bob", "text": "two", "client_msg_id": "b-2"},
        ]
        result = await svc.send_batch(messages)
        sent, refused, sent2 = result.results
        assert isinstance(sent, BatchSent) and isinstance(sent2, BatchSent) and isinstance(refused, BatchRefused)
        assert (sent.status, sent.conversation_seq, sent2.conversation_seq) == (201, 1, 2)
        assert (refused.status, refused.error) == (403, "NOT_A_MEMBER")
        again = await svc.send_batch([messages[0], messages[2]])
        assert [(r.status, getattr(r, "conversation_seq", None)) for r in again.results] == [(200, 1), (200, 2)]
        assert (await svc.head(cid)).latest_conversation_seq == 2


async def test_a_rate_limited_send_waits_as_retry_after_says_and_resends_the_same_body(
    tight: ServeProcess, tmp_path: Path
) -> None:
    tenant, cid = f"t-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:6]}"
    waits: list[float] = []
    async with service(tight.url, tenant) as svc:

        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            await asyncio.sleep(seconds)

        svc.http.sleep = sleep
        await svc.create_conversation(cid, members=["ann", "bob"])
        await svc.send(cid, "ann", "first")
        second = await svc.send(cid, "ann", "second, after the wait")  # refused once: 429 with Retry-After
        assert second.conversation_seq == 2 and svc.position == second.position
    assert waits and waits[0] >= 0.5, waits  # the server's hint (about a second), not a blind immediate retry
    import aiohttp

    async with aiohttp.ClientSession() as session:
        bob = Api(session, tight).user(tenant, "bob")  # type: ignore[arg-type]
        page = expect(await bob.history(cid, min_position=second.position), 200)
    assert [m["text"] for m in page["messages"]] == ["first", "second, after the wait"]  # sent once, as first sent
