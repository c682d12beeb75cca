"""Read-your-writes (README "Fresh reads"): every write answers its log position, a read
given that position waits until the views hold it, and a message not projected yet has a
`pending` delivery record with what the command side knows.

The projector is paused, so "the views are behind" is a fact of the test, not a race:
on the embedded runtime by holding the views' write lock (the runner's thread stays alive
and cannot commit), on the distributed one by stopping the relay (SIGSTOP: nothing new
reaches Kafka, so no worker can apply it). A read that
is waiting shows in `/v1/admin/projections` (`waiting_reads`), which is how the tests
know the request is parked before they let the projector go on (no sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from domain.params import Parameters
from tests.e2e.conftest import FAST, Api, ApiClient, Reply, Server, conversation, eventually, expect, serving

T = "fresh"
# A parked read must outlast the test's own steps with margin on a loaded machine.
PARAMS: Parameters = dataclasses.replace(FAST, fresh_read_timeout=60.0)


@contextlib.contextmanager
def projector_paused(server: Server) -> Iterator[None]:
    if server.cluster is not None:
        server.cluster.pause("relay")
        try:
            yield
        finally:
            server.cluster.resume("relay")
        return
    lock = server.runtime.views._write_lock  # type: ignore[attr-defined]
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def position_of(reply: Reply) -> int:
    """A write's position: the body field and the header agree."""
    position = reply.body["position"]
    assert isinstance(position, int) and position > 0, reply.body
    assert reply.headers["X-Fanout-Position"] == str(position)
    return position


async def waiting_reads(admin: ApiClient) -> int:
    return int(expect(await admin.projections(), 200)["waiting_reads"])


async def test_after_a_bulk_add_the_head_read_at_its_position_shows_the_new_member_count(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, T, cid, ["ann"])
    admin = api.admin(T)
    members = [f"u{i}" for i in range(20)]
    settled = await svc.call("GET", f"/v1/conversations/{cid}", params={"min_position": server.written()})
    assert expect(settled, 200)["member_count"] == 1  # the views hold the conversation before the pause
    with projector_paused(server):
        added = await svc.add_members(cid, members)
        expect(added, 200)
        position = position_of(added)
        stale = expect(await svc.head(cid), 200)
        assert stale["member_count"] == 1  # the views are behind: the old count
        read = asyncio.create_task(svc.call("GET", f"/v1/conversations/{cid}", params={"min_position": position}))
        await eventually(lambda: waiting_reads(admin), lambda n: n >= 1)
        assert not read.done()
    head = expect(await read, 200)
    assert head["member_count"] == 21
    assert await waiting_reads(admin) == 0


async def test_after_mark_read_the_session_list_read_at_its_position_shows_the_new_read_seq(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, T, cid, ["ann", "bob"])
    bob, admin = api.user(T, "bob"), api.admin(T)
    for i in range(3):
        last = expect(await svc.send(cid, sender="ann", text=f"m{i}"), 201)
    before = await bob.call("GET", "/v1/me/sessions", headers={"X-Fanout-Min-Position": str(last["position"])})
    [item] = [s for s in expect(before, 200)["sessions"] if s["conversation_id"] == cid]
    assert item["read_conversation_seq"] == 0 and item["unread_count"] == 3
    with projector_paused(server):
        marked = await bob.read(cid, 2)
        assert expect(marked, 200)["coalesced"] is False
        position = position_of(marked)
        [stale] = [s for s in expect(await bob.sessions(), 200)["sessions"] if s["conversation_id"] == cid]
        assert stale["read_conversation_seq"] == 0  # the views are behind: the old read seq
        read = asyncio.create_task(
            bob.call("GET", "/v1/me/sessions", headers={"X-Fanout-Min-Position": str(position)})
        )
        await eventually(lambda: waiting_reads(admin), lambda n: n >= 1)
        assert not read.done()
    [fresh] = [s for s in expect(await read, 200)["sessions"] if s["conversation_id"] == cid]
    assert fresh["read_conversation_seq"] == 2 and fresh["unread_count"] == 1


async def test_a_message_not_projected_yet_has_a_pending_delivery_record_with_what_is_known(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, T, cid, ["ann", "bob", "cat"])
    with projector_paused(server):
        sent_reply = await svc.send(cid, sender="ann", text="hello @bob", mentions=["bob"])
        sent = expect(sent_reply, 201)
        position = position_of(sent_reply)
        pending = expect(await svc.delivery(cid, sent["conversation_seq"]), 200)
        assert pending["state"] == "pending" and pending["materialized_at"] is None
        assert pending["message_id"] == sent["message_id"]
        assert pending["conversation_seq"] == sent["conversation_seq"]
        assert pending["write_policy"] == "always" and pending["member_count"] == 3
        assert pending["mailbox_entries"] == 3  # what it will create (what the quota was charged)
        assert pending["shards"] is None and pending["online_pushes"] is None
    record = await svc.call(
        "GET", f"/v1/conversations/{cid}/messages/{sent['conversation_seq']}/delivery", params={"min_position": position}
    )
    done = expect(record, 200)
    assert done["state"] == "materialized" and done["materialized_at"] is not None
    assert done["message_id"] == sent["message_id"] and done["mailbox_entries"] == 3


async def test_a_bad_min_position_is_invalid_argument(api: Api, server: Server, cid: str) -> None:
    svc = await conversation(api, T, cid, ["ann"])
    beyond = server.written() + 1000
    for params, headers in (
        ({"min_position": "soon"}, {}),
        ({}, {"X-Fanout-Min-Position": "-1"}),
        ({"min_position": beyond}, {}),
    ):
        reply = await svc.call("GET", f"/v1/conversations/{cid}", params=params, headers=headers)
        expect(reply, 400, "INVALID_ARGUMENT")


@pytest.mark.runtimes("embedded")  # its own embedded server with no projector at all (serving(start_runtime=False))
async def test_a_read_whose_position_the_views_cannot_reach_is_unavailable_with_a_retry_hint(
    api: Api, tmp_path: Path, cid: str
) -> None:
    with serving(tmp_path, start_runtime=False) as stopped:  # no projector at all
        svc = ApiClient(api.session, stopped.url, api.service(T).token)
        created = await svc.create_conversation(conversation_id=cid, members=["ann"])
        expect(created, 201)
        position = position_of(created)
        reply = await svc.call("GET", f"/v1/conversations/{cid}", params={"min_position": position})
        body = expect(reply, 503, "UNAVAILABLE")
        assert body["details"]["min_position"] == position and body["details"]["position"] < position
        assert body["details"]["retry_after_ms"] > 0 and int(reply.headers["Retry-After"]) >= 1
