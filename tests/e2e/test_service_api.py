"""The service role: conversations, members, messages, heads and delivery records."""

from __future__ import annotations

from tests.e2e.conftest import Api, Server, conversation, expect


async def test_a_service_creates_a_conversation_and_reads_its_head(api: Api, cid: str) -> None:
    svc = api.service("acme")
    created = expect(await svc.create_conversation(conversation_id=cid, title="ops", members=["ann", "bob"]), 201)
    assert created == {"conversation_id": cid, "title": "ops", "member_count": 2, "position": created["position"]}

    head = expect(await svc.head(cid), 200)
    assert head["latest_conversation_seq"] == 0
    assert head["member_count"] == 2
    assert head["size_bucket"] == "small"
    assert head["write_policy"] == "always"
    assert {"last_activity_id", "preview"} <= set(head)


async def test_a_conversation_without_an_id_gets_a_generated_one(api: Api) -> None:
    created = expect(await api.service("acme").create_conversation(), 201)
    assert created["conversation_id"].startswith("c_")
    assert created["member_count"] == 0


async def test_a_sent_message_moves_the_head_and_is_materialized_for_every_member(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob", "cat"])
    sent = expect(await svc.send(cid, sender="ann", text="hello all"), 201)
    assert set(sent) == {"conversation_seq", "message_id", "write_policy", "position"}
    assert sent["conversation_seq"] == 1 and sent["write_policy"] == "always"

    record = await svc.materialized(cid, 1)
    assert record["mailbox_entries"] == 3
    assert record["message_id"] == sent["message_id"]
    assert record["body_writes"] == 1 and record["head_writes"] == 1
    assert record["shards"] >= 1 and record["online_pushes"] == 0

    head = expect(await svc.head(cid), 200)
    assert head["latest_conversation_seq"] == 1
    assert head["last_activity_id"] == sent["message_id"]
    assert head["preview"] == "hello all"


async def test_a_retry_with_the_same_client_msg_id_returns_the_same_seq_and_writes_nothing(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    first = expect(await svc.send(cid, sender="ann", text="once", client_msg_id="k-1"), 201)
    before = server.written()
    retry = expect(await svc.send(cid, sender="ann", text="once", client_msg_id="k-1"), 200)
    assert retry == first
    assert server.written() == before
    await svc.materialized(cid, 1)
    assert expect(await svc.head(cid), 200)["latest_conversation_seq"] == 1


async def test_members_are_added_in_bulk_and_removed_one_by_one(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann"])
    added = expect(await svc.add_members(cid, ["bob", "cat", "ann"]), 200)
    assert added == {"added": 2, "member_count": 3, "position": added["position"]}
    removed = expect(await svc.remove_member(cid, "cat"), 200)
    assert removed == {"member_count": 2, "position": removed["position"]} and removed["position"] > added["position"]
    sent = expect(await svc.send(cid, sender="bob", text="after leave"), 201)
    assert (await svc.materialized(cid, sent["conversation_seq"]))["mailbox_entries"] == 2


async def test_joining_beyond_max_group_members_is_group_full_and_adds_nobody(
    api: Api, server: Server, cid: str
) -> None:
    svc = await conversation(api, "acme", cid, [f"u{i}" for i in range(45)])
    before = server.written()
    expect(await svc.add_members(cid, [f"v{i}" for i in range(6)]), 409, "GROUP_FULL")
    assert server.written() == before
    assert expect(await svc.head(cid), 200)["member_count"] == 45


async def test_creating_an_existing_conversation_is_already_exists(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann"])
    reply = expect(await svc.create_conversation(conversation_id=cid), 409, "ALREADY_EXISTS")
    assert reply["details"]["conversation_id"] == cid


async def test_a_sender_or_leaver_who_is_not_a_member_is_not_a_member(api: Api, server: Server, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann"])
    before = server.written()
    expect(await svc.send(cid, sender="mallory", text="hi"), 403, "NOT_A_MEMBER")
    expect(await svc.remove_member(cid, "mallory"), 403, "NOT_A_MEMBER")
    assert server.written() == before


async def test_unknown_conversations_are_not_found(api: Api) -> None:
    svc = api.service("acme")
    expect(await svc.head("no-such"), 404, "NOT_FOUND")
    expect(await svc.send("no-such", sender="ann", text="x"), 404, "NOT_FOUND")
    expect(await svc.add_members("no-such", ["ann"]), 404, "NOT_FOUND")
    expect(await svc.remove_member("no-such", "ann"), 404, "NOT_FOUND")
    expect(await svc.delivery("no-such", 1), 404, "NOT_FOUND")


async def test_a_delivery_record_of_a_negative_zero_future_or_non_numeric_seq_is_invalid(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann"])
    expect(await svc.send(cid, sender="ann", text="one"), 201)
    for seq in ("-1", "0", "2", "99", "abc"):
        reply = expect(await svc.delivery(cid, seq), 400, "INVALID_ARGUMENT")
        assert reply["details"]["field"] == "seq"


async def test_an_admin_token_may_call_service_routes(api: Api, cid: str) -> None:
    admin = api.admin("acme")
    expect(await admin.create_conversation(conversation_id=cid, members=["ann"]), 201)
    expect(await admin.send(cid, sender="ann", text="from ops"), 201)
    expect(await admin.head(cid), 200)
