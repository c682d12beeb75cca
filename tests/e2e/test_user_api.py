"""The user role over HTTP: session list, mailbox cursor, MARK_READ, history, REBUILD."""

from __future__ import annotations

from tests.e2e.conftest import Api, conversation, eventually, expect


async def send_many(api: Api, cid: str, texts: list[str], sender: str = "ann") -> None:
    svc = api.service("acme")
    seq = 0
    for text in texts:
        seq = expect(await svc.send(cid, sender=sender, text=text), 201)["conversation_seq"]
    await svc.materialized(cid, seq)


async def test_the_session_list_shows_unread_and_mentions_of_each_conversation(api: Api, cid: str) -> None:
    bob_id = f"bob-{cid}"
    svc = await conversation(api, "acme", cid, ["ann", bob_id])
    expect(await svc.send(cid, sender="ann", text="one"), 201)
    expect(await svc.send(cid, sender="ann", text=f"hey @{bob_id}", mentions=[bob_id]), 201)
    await svc.materialized(cid, 2)

    listing = expect(await api.user("acme", bob_id).sessions(), 200)
    assert listing["big_group_heads"] == []
    (item,) = listing["sessions"]
    assert item["conversation_id"] == cid
    assert item["write_policy"] == "always"
    assert item["latest_conversation_seq"] == 2
    assert item["read_conversation_seq"] == 0
    assert item["unread_count"] == 2 and item["unread_exact"] is True
    assert item["mention_count"] == 1
    assert item["preview"] == f"hey @{bob_id}"
    assert "last_activity_id" in item


async def test_the_mailbox_cursor_pages_through_every_entry_without_skipping(api: Api, cid: str) -> None:
    bob_id = f"bob-{cid}"
    await conversation(api, "acme", cid, ["ann", bob_id])
    await send_many(api, cid, [f"m{i}" for i in range(7)])
    bob = api.user("acme", bob_id)

    seen: list[int] = []
    after = 0
    while True:
        page = expect(await bob.mailbox(after=after, limit=3), 200)
        seen += [e["conversation_seq"] for e in page["entries"]]
        assert all(e["conversation_id"] == cid for e in page["entries"])
        after = page["next_after"]
        if not page["more"]:
            break
    assert seen == list(range(1, 8))
    assert expect(await bob.mailbox(after=after), 200)["entries"] == []


async def test_mark_read_makes_the_unread_count_zero(api: Api, cid: str) -> None:
    bob_id = f"bob-{cid}"
    await conversation(api, "acme", cid, ["ann", bob_id])
    await send_many(api, cid, ["a", "b", "c"])
    bob = api.user("acme", bob_id)
    read = expect(await bob.read(cid, 3), 200)
    assert read == {"conversation_id": cid, "read_seq": 3, "coalesced": False, "position": read["position"]}

    # The read lands through the projection: poll the session list rather than sleep.
    listing = await eventually(bob.sessions, lambda r: r.body["sessions"][0]["read_conversation_seq"] == 3)
    (item,) = listing.body["sessions"]
    assert item["unread_count"] == 0 and item["unread_exact"] is True


async def test_history_pages_after_a_seq_and_flags_more(api: Api, cid: str) -> None:
    await conversation(api, "acme", cid, ["ann", "bob"])
    await send_many(api, cid, ["h1", "h2", "h3", "h4"])
    bob = api.user("acme", "bob")

    page = expect(await bob.history(cid, after_seq=1, limit=2), 200)
    assert [m["conversation_seq"] for m in page["messages"]] == [2, 3]
    assert [m["text"] for m in page["messages"]] == ["h2", "h3"]
    assert page["more"] is True and page["latest_conversation_seq"] == 4
    rest = expect(await bob.history(cid, after_seq=3), 200)
    assert [m["conversation_seq"] for m in rest["messages"]] == [4]
    assert rest["more"] is False
    assert expect(await bob.history(cid, after_seq=4), 200)["messages"] == []


async def test_rebuild_answers_with_the_fresh_session_item(api: Api, cid: str) -> None:
    await conversation(api, "acme", cid, ["ann", "bob"])
    await send_many(api, cid, ["r1", "r2"])
    rebuilt = expect(await api.user("acme", "bob").rebuild(cid), 200)
    assert rebuilt["conversation_id"] == cid and rebuilt["rebuilt_at_seq"] == 2
    (item,) = rebuilt["sessions"]
    assert item["unread_count"] == 2 and item["unread_exact"] is True
    assert rebuilt["big_group_heads"] == []


async def test_a_user_who_is_not_a_member_cannot_read_mark_or_rebuild(api: Api, cid: str) -> None:
    await conversation(api, "acme", cid, ["ann"])
    await send_many(api, cid, ["private"])
    eve = api.user("acme", "eve")
    expect(await eve.history(cid), 403, "NOT_A_MEMBER")
    expect(await eve.read(cid, 1), 403, "NOT_A_MEMBER")
    expect(await eve.rebuild(cid), 403, "NOT_A_MEMBER")


async def test_unknown_conversations_are_not_found_for_a_user(api: Api) -> None:
    ann = api.user("acme", "ann")
    expect(await ann.history("no-such"), 404, "NOT_FOUND")
    expect(await ann.read("no-such", 0), 404, "NOT_FOUND")
    expect(await ann.rebuild("no-such"), 404, "NOT_FOUND")
