"""WebSocket /v1/ws: AUTH -> AUTH_OK -> SESSION_LIST_BATCH -> live MESSAGE / HEAD, and
MARK_READ, PULL_HISTORY, REBUILD; errors are ERROR frames and the socket stays open."""

from __future__ import annotations

import asyncio
import time
import uuid

from tests.e2e.conftest import Api, conversation, eventually, expect, quiet_group_with_review_enabled


async def test_a_client_syncs_receives_live_messages_marks_read_pulls_history_and_rebuilds(api: Api, cid: str) -> None:
    bob_id = f"bob-{cid}"
    svc = await conversation(api, "acme", cid, ["ann", bob_id])
    expect(await svc.send(cid, sender="ann", text="while offline"), 201)
    await svc.materialized(cid, 1)

    sock = await api.user("acme", bob_id).socket()
    assert await sock.expect("AUTH_OK") == {"type": "AUTH_OK", "user_id": bob_id, "tenant": "acme"}
    (batch,) = await sock.session_list()
    assert batch["big_group_heads"] == [] and batch["last"] is True
    (item,) = batch["sessions"]
    assert item["conversation_id"] == cid and item["unread_count"] == 1 and item["latest_conversation_seq"] == 1

    sent = expect(await svc.send(cid, sender="ann", text="live now"), 201)
    live = await sock.expect_live("MESSAGE", cid, 2)
    assert live["conversation_id"] == cid and live["conversation_seq"] == 2
    assert live["message_id"] == sent["message_id"] and live["text"] == "live now"
    assert live["materialized"] is True and live["sender"] == "ann"
    assert (await svc.materialized(cid, 2))["mailbox_entries"] == 2

    await sock.send(type="MARK_READ", conversation_id=cid, read_seq=2)
    read = await sock.expect("READ_OK")
    assert read == {
        "type": "READ_OK",
        "conversation_id": cid,
        "read_seq": 2,
        "coalesced": False,
        "position": read["position"],
    }

    await sock.send(type="PULL_HISTORY", conversation_id=cid, after_seq=0, limit=1)
    history = await sock.expect("HISTORY")
    assert history["conversation_id"] == cid and history["latest_conversation_seq"] == 2
    assert [m["text"] for m in history["messages"]] == ["while offline"] and history["more"] is True

    await sock.send(type="REBUILD", conversation_id=cid)
    rebuilt = await sock.expect("REBUILD_OK")
    assert rebuilt == {
        "type": "REBUILD_OK",
        "conversation_id": cid,
        "rebuilt_at_seq": 2,
        "position": rebuilt["position"],
    }
    fresh = await sock.expect("SESSION_LIST_BATCH")
    assert fresh["last"] is True and fresh["big_group_heads"] == []
    (item,) = fresh["sessions"]
    assert item["read_conversation_seq"] == 2 and item["unread_count"] == 0 and item["unread_exact"] is True
    await sock.close()


async def test_an_online_push_is_counted_in_the_delivery_record(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob", "cat"])
    sock = await api.user("acme", "cat").socket()
    await sock.expect("AUTH_OK")
    await sock.session_list()
    expect(await svc.send(cid, sender="ann", text="ping"), 201)
    await sock.expect("MESSAGE")
    deadline = time.monotonic() + 5
    while (await svc.materialized(cid, 1))["online_pushes"] < 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await sock.close()


async def test_a_first_frame_that_is_not_auth_is_refused_and_closed(api: Api) -> None:
    sock = await api.user("acme", "ann").socket(auth=False)
    await sock.send(type="PULL_HISTORY", conversation_id="x", after_seq=0, limit=1)
    error = await sock.expect("ERROR")
    assert error["error"] == "UNAUTHENTICATED" and error["message"]
    assert await sock.closed()


async def test_a_bad_token_or_a_non_user_token_on_the_socket_is_refused(api: Api) -> None:
    for client, code in (
        (api.as_token("garbage"), "UNAUTHENTICATED"),
        (api.service("acme"), "FORBIDDEN"),
        (api.admin("acme"), "FORBIDDEN"),
    ):
        sock = await client.socket()
        assert (await sock.expect("ERROR"))["error"] == code
        assert await sock.closed()


async def test_errors_in_frames_are_error_frames_and_the_connection_stays_open(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await svc.send(cid, sender="ann", text="one"), 201)
    await svc.materialized(cid, 1)
    other = f"{cid}-other"
    await conversation(api, "acme", other, ["ann"])

    sock = await api.user("acme", "bob").socket()
    await sock.expect("AUTH_OK")
    await sock.session_list()
    cases = [
        ({"type": "DANCE"}, "INVALID_ARGUMENT"),
        ({"type": "MARK_READ", "conversation_id": cid}, "INVALID_ARGUMENT"),
        ({"type": "MARK_READ", "conversation_id": cid, "read_seq": 9}, "INVALID_ARGUMENT"),
        ({"type": "MARK_READ", "conversation_id": cid, "read_seq": -1}, "INVALID_ARGUMENT"),
        ({"type": "MARK_READ", "conversation_id": cid, "read_seq": 1, "extra": True}, "INVALID_ARGUMENT"),
        ({"type": "PULL_HISTORY", "conversation_id": cid, "after_seq": 5, "limit": 10}, "INVALID_ARGUMENT"),
        ({"type": "PULL_HISTORY", "conversation_id": cid, "after_seq": 0, "limit": 0}, "INVALID_ARGUMENT"),
        ({"type": "PULL_HISTORY", "conversation_id": other, "after_seq": 0, "limit": 10}, "NOT_A_MEMBER"),
        ({"type": "REBUILD", "conversation_id": "no-such"}, "NOT_FOUND"),
        ({"type": "AUTH", "token": "again"}, "INVALID_ARGUMENT"),
    ]
    for frame, code in cases:
        await sock.send(**frame)
        error = await sock.expect_live("ERROR", cid, 2)  # past a late push of "one", which the list showed
        assert error["error"] == code, (frame, error)
        assert set(error) == {"type", "error", "message", "details"}
    await sock.ws.send_str("{not json")
    assert (await sock.expect_live("ERROR", cid, 2))["error"] == "INVALID_ARGUMENT"

    await sock.send(type="PULL_HISTORY", conversation_id=cid, after_seq=0, limit=10)
    assert [m["text"] for m in (await sock.expect_live("HISTORY", cid, 2))["messages"]] == ["one"]
    await sock.close()


async def test_a_silent_member_of_a_mention_only_group_gets_the_message_unmaterialized_and_a_head(
    api: Api, cid: str
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    svc, _admin, _rid = await quiet_group_with_review_enabled(api, tenant, cid)
    await eventually(lambda: svc.head(cid), lambda r: r.body["write_policy"] == "mention_only")

    sock = await api.user(tenant, "quiet1").socket()
    await sock.expect("AUTH_OK")
    (batch,) = await sock.session_list()
    assert [h["conversation_id"] for h in batch["big_group_heads"]] == [cid]

    expect(await svc.send(cid, sender="ann", text="to the active only"), 201)
    message = await sock.expect_live("MESSAGE", cid, 2)
    assert message["conversation_seq"] == 2 and message["materialized"] is False
    head = await sock.expect("HEAD")
    assert head == {
        "type": "HEAD",
        "conversation_id": cid,
        "latest_conversation_seq": 2,
        "last_activity_id": message["message_id"],
        "preview": "to the active only",
    }
    await sock.close()


async def test_a_socket_of_another_tenant_with_the_same_user_id_receives_nothing_of_this_tenant(
    api: Api, cid: str
) -> None:
    user = f"ann-{cid}"
    acme = await conversation(api, "acme", cid, ["zed", user])
    globex = await conversation(api, "globex", cid, ["zed", user])
    await eventually(api.user("globex", user).sessions, lambda r: len(r.body["sessions"]) == 1)
    sock = await api.user("globex", user).socket()
    await sock.expect("AUTH_OK")
    (batch,) = await sock.session_list()
    assert [s["conversation_id"] for s in batch["sessions"]] == [cid]

    expect(await acme.send(cid, sender="zed", text="acme secret"), 201)
    await acme.materialized(cid, 1)
    expect(await globex.send(cid, sender="zed", text="globex hello"), 201)
    message = await sock.expect("MESSAGE")
    assert message["text"] == "globex hello"
    await sock.close()
