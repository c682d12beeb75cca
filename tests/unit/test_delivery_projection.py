"""DeliveryProjection alone: events from a real application (POPO event store) folded
into the in-memory views; what it writes and the Delivered records it returns."""

from __future__ import annotations

import pytest

from domain.delivery import MENTION, OWN
from domain.params import Parameters
from projections.delivery import Delivered, DeliveryProjection
from projections.state import session_item
from tests.unit.projection_log import ProjectionLog

T = "acme"
PARAMS = Parameters(mailbox_shards=4)


@pytest.fixture
def log() -> ProjectionLog:
    return ProjectionLog(PARAMS)


def sessions(log: ProjectionLog, user: str) -> dict[str, dict[str, object]]:
    return {h.conversation_id: session_item(h, st) for b in log.views.sessions(T, user, 50) for h, st in b}


def test_a_message_in_always_reaches_every_member_at_send(log: ProjectionLog) -> None:
    p = DeliveryProjection(log.views, PARAMS)
    log.app.create_conversation(T, "g", "G", ["a", "b", "c"])
    log.app.send_message(T, "g", sender="a", text="hi @b", mentions=["b"])
    log.app.add_members(T, "g", ["late"])  # joins after the send, in the same unit of work
    (d,) = log.apply(p)
    assert isinstance(d, Delivered) and (d.tenant, d.conversation_id, d.seq) == (T, "g", 1)
    assert d.materialized is None  # always: every member is a recipient
    assert [u for u in ["a", "b", "c", "late"] if d.was_member(u)] == ["a", "b", "c"]
    assert d.message["text"] == "hi @b" and d.message["sender"] == "a"
    entries = {u: log.views.mailbox_page(T, u, 0, 10) for u in ["a", "b", "c", "late"]}
    assert {u: [(e[2], e[4]) for e in es] for u, es in entries.items()} == {
        "a": [(1, OWN)],
        "b": [(1, MENTION)],
        "c": [(1, 0)],
        "late": [],
    }
    record = log.views.delivery(T, "g", 1)
    assert record is not None and record["mailbox_entries"] == 3 and record["member_count"] == 3
    s = sessions(log, "b")["g"]
    assert (s["unread_count"], s["mention_count"], s["unread_exact"]) == (1, 1, True)
    assert sessions(log, "a")["g"]["unread_count"] == 0  # sending marks read
    assert log.views.head(T, "g")["member_count"] == 4


def test_a_member_who_left_gets_nothing_more(log: ProjectionLog) -> None:
    p = DeliveryProjection(log.views, PARAMS)
    log.app.create_conversation(T, "g", "G", ["a", "b", "c"])
    log.app.remove_member(T, "g", "c")
    log.app.send_message(T, "g", sender="a", text="after c left")
    (d,) = log.apply(p)
    assert not d.was_member("c") and d.was_member("b")
    assert log.views.mailbox_page(T, "c", 0, 10) == [] and log.views.state(T, "c", "g") is None
    assert log.views.user_states(T, "c") == {}


def test_read_and_rebuild_make_the_counts_exact(log: ProjectionLog) -> None:
    p = DeliveryProjection(log.views, PARAMS)
    log.app.create_conversation(T, "g", "G", ["a", "b"])
    for text in ("one @b", "two", "@all three"):
        log.clock.advance(5)
        log.app.send_message(
            T, "g", sender="a", text=text, mentions=["b"] if "@b" in text else [], mention_all="@all" in text
        )
    log.apply(p)
    assert (sessions(log, "b")["g"]["unread_count"], sessions(log, "b")["g"]["mention_count"]) == (3, 2)
    log.app.mark_read(T, "g", "b", 2)
    log.app.request_rebuild(T, "g", "b")
    assert log.apply(p) == []
    s = sessions(log, "b")["g"]
    assert (s["read_conversation_seq"], s["unread_count"], s["mention_count"]) == (2, 1, 1)
    assert log.views.user_states(T, "b")["g"].rebuilt_seq == 3


def test_an_event_applied_twice_changes_nothing(log: ProjectionLog) -> None:
    log.app.create_conversation(T, "g", "G", ["a", "b"])
    log.app.send_message(T, "g", sender="a", text="hi @b", mentions=["b"])
    events = log.events()
    log.apply(DeliveryProjection(log.views, PARAMS), events)
    before = (log.views.head(T, "g"), dict(log.views.user_states(T, "b")), log.views.mailbox.count())
    again = log.apply(DeliveryProjection(log.views, PARAMS), events)  # a fresh host, at-least-once
    assert again == []  # nothing pushed twice either
    assert (log.views.head(T, "g"), dict(log.views.user_states(T, "b")), log.views.mailbox.count()) == before


def test_mention_only_materializes_the_sender_the_mentioned_and_the_active(log: ProjectionLog) -> None:
    p = DeliveryProjection(log.views, PARAMS)
    members = ["a", "b", "quiet1", "quiet2", "quiet3", "quiet4"]
    log.app.create_conversation(T, "g", "G", members)
    log.apply(p)
    log.clock.advance(30 * 86400)  # everyone silent for longer than the activity window
    review = log.app.open_review(T, "small", "manual", {}, "ops")
    log.app.decide_review(T, review["review_id"], "enable_mention_only", "ops", 1.0, 0.9)
    log.apply(p)
    assert log.views.head(T, "g")["write_policy"] == "mention_only"
    log.clock.advance(5)
    log.app.send_message(T, "g", sender="a", text="@b look", mentions=["b"])
    (d,) = log.apply(p)
    assert d.materialized == frozenset({"a", "b"})
    assert all(d.was_member(u) for u in members)  # every member is still pushed online
    assert log.views.mailbox_page(T, "quiet1", 0, 10) == []
    q = sessions(log, "quiet1")["g"]
    assert q["unread_count"] == 1 and q["unread_exact"] is False and q["delivered_conversation_seq"] == 0
    assert log.views.delivery(T, "g", 1)["mailbox_entries"] == 2


class _HeadPuts:
    """The unit's writer, recording each head put's bucket and whether it carried its lookups."""

    def __init__(self, writer: object, puts: list[tuple[str, str, bool]]) -> None:
        self._w, self.puts = writer, puts

    def __getattr__(self, name: str) -> object:
        return getattr(self._w, name)

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, object], *, lookups: bool = True) -> None:
        self.puts.append((conversation_id, str(head["size_bucket"]), lookups))
        self._w.put_head(tenant, conversation_id, head, lookups=lookups)  # type: ignore[attr-defined]


def test_a_head_carries_its_lookups_only_when_created_or_its_size_bucket_moves() -> None:
    """ADR-0049: a send, a read, a join within the bucket put the head alone; the creation and
    a membership change that moves the size bucket put it with its lookups, also when the
    conversation's working set was reloaded from the views in between."""
    params = Parameters(mailbox_shards=4, small_max_members=3)
    log = ProjectionLog(params)
    puts: list[tuple[str, str, bool]] = []

    def unit(p: DeliveryProjection) -> None:
        log.apply(p, wrap=lambda w: _HeadPuts(w, puts))

    p = DeliveryProjection(log.views, params)
    log.app.create_conversation(T, "g", "G", ["a", "b"])
    unit(p)
    assert puts[0] == ("g", "small", True)  # created
    assert all(bucket == "small" for _, bucket, _ in puts)
    puts.clear()
    log.app.send_message(T, "g", sender="a", text="hi")
    log.app.mark_read(T, "g", "b", 1)
    log.app.add_members(T, "g", ["c"])  # 3 members: still small
    unit(p)
    assert puts and not any(lookups for _, _, lookups in puts)
    puts.clear()
    p = DeliveryProjection(log.views, params)  # the working set reloaded from the views
    log.app.send_message(T, "g", sender="b", text="again")
    log.app.add_members(T, "g", ["d"])  # 4 members: medium
    log.app.send_message(T, "g", sender="d", text="hello")
    unit(p)
    assert puts == [("g", "small", False), ("g", "medium", True), ("g", "medium", False)]
    assert log.views.heads_by_scope(T, "medium") == ["g"] and log.views.heads_by_scope(T, "small") == []
