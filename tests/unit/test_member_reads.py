"""ADR-0018 in pieces: the MemberReadState aggregate, Conversation.record_activity, the
delivery projection's folding of members' reads and of MembersActive (with a legacy
Conversation.ReadMarked still folded), and the relay's key for a member's read."""

from __future__ import annotations

from typing import Any

import pytest

from domain.conversation import Conversation
from domain.params import Parameters
from domain.reads import MemberReadState
from projections.delivery import DeliveryProjection
from projections.state import session_item
from streams.routing import RoutingKeys
from tests.unit.projection_log import ProjectionLog

T = "acme"
PARAMS = Parameters(mailbox_shards=4)


@pytest.fixture
def log() -> ProjectionLog:
    return ProjectionLog(PARAMS)


def session(log: ProjectionLog, user: str, cid: str = "g") -> dict[str, Any]:
    items = {h.conversation_id: session_item(h, st) for b in log.views.sessions(T, user, 50) for h, st in b}
    return items[cid]


def test_a_member_read_state_id_is_derived_and_injective() -> None:
    a = MemberReadState.create_id(T, "c", "u")
    assert a == MemberReadState.create_id(T, "c", "u")
    # ids may hold '/': the conversation id's length keeps (c/x, y) and (c, x/y) apart
    assert MemberReadState.create_id(T, "c/x", "y") != MemberReadState.create_id(T, "c", "x/y")
    assert MemberReadState.create_id(T, "c", "u") != MemberReadState.create_id("other", "c", "u")
    assert MemberReadState.create_id(T, "c", "u") != Conversation.create_id(T, "c")


def test_a_read_seq_only_moves_forward() -> None:
    m = MemberReadState(tenant=T, conversation_id="c", user_id="u", read_seq=3, at=1.0)
    assert m.mark(3, 2.0) is False and m.mark(1, 2.0) is False
    assert m.mark(5, 3.0) is True and m.read_seq == 5
    events = m.collect_events()
    assert [type(e).__qualname__ for e in events] == ["MemberReadState.Created", "MemberReadState.ReadMarked"]
    assert all((e.tenant, e.conversation_id, e.user_id) == (T, "c", "u") for e in events)  # type: ignore[attr-defined]


def test_record_activity_records_only_news_of_members_in_one_event() -> None:
    conv = Conversation(tenant=T, conversation_id="c", title="", at=0.0)
    conv.join(["a", "b", "c"], 0.0, PARAMS)
    conv.collect_events()
    assert conv.record_activity({"a": 5.0, "b": 6.0, "stranger": 7.0}, 8.0) == {"a": 5.0, "b": 6.0}
    assert conv.record_activity({"a": 4.0}, 9.0) == {}  # older than what is recorded: nothing
    (e,) = conv.collect_events()
    assert isinstance(e, Conversation.MembersActive) and e.active == {"a": 5.0, "b": 6.0}
    assert conv.members == {"a": 5.0, "b": 6.0, "c": 0.0}


def test_the_projection_folds_member_reads_and_activity(log: ProjectionLog) -> None:
    p = DeliveryProjection(log.views, PARAMS)
    log.app.activity_flush_interval = 3600.0  # flushed by hand below
    log.app.create_conversation(T, "g", "G", ["a", "b"])
    for text in ("one @b", "@all two", "three"):
        log.clock.advance(5)
        log.app.send_message(T, "g", sender="a", text=text, mentions=["b"] if "@b" in text else [], mention_all="@all" in text)
    log.apply(p)
    log.app.mark_read(T, "g", "b", 1)
    log.app.mark_read(T, "g", "b", 2)
    events = log.events()
    assert [type(e).__qualname__ for _, e in events] == ["MemberReadState.Created", "MemberReadState.ReadMarked"]
    log.apply(p, events)
    s = session(log, "b")
    assert (s["read_conversation_seq"], s["unread_count"], s["mention_count"]) == (2, 1, 0)
    assert log.views.user_states(T, "b")["g"].last_active == 0.0  # activity arrives with MembersActive
    assert log.views.head(T, "g")["position"] == events[-1][0]
    assert log.app.flush_activity() == 1
    (active,) = log.events()
    assert isinstance(active[1], Conversation.MembersActive)
    log.apply(p, [active])
    assert log.views.user_states(T, "b")["g"].last_active == log.clock.now
    # applied again (at-least-once): the head position skips them
    before = (log.views.head(T, "g"), dict(log.views.user_states(T, "b")))
    log.apply(DeliveryProjection(log.views, PARAMS), [*events, active])
    assert (log.views.head(T, "g"), dict(log.views.user_states(T, "b"))) == before


def test_a_legacy_conversation_read_marked_is_still_folded() -> None:
    log = ProjectionLog(PARAMS)
    log.app.legacy_read_marks = True  # writes Conversation.ReadMarked, as logs before ADR-0018 hold
    p = DeliveryProjection(log.views, PARAMS)
    log.app.create_conversation(T, "g", "G", ["a", "b"])
    log.clock.advance(5)
    log.app.send_message(T, "g", sender="a", text="one")
    log.apply(p)
    log.app.mark_read(T, "g", "b", 1)
    events = log.events()
    assert [type(e).__qualname__ for _, e in events] == ["Conversation.ReadMarked"]
    log.apply(p, events)
    assert session(log, "b")["unread_count"] == 0
    assert log.views.user_states(T, "b")["g"].last_active == log.clock.now


def test_the_relay_keys_a_member_read_by_its_conversation(log: ProjectionLog) -> None:
    log.app.create_conversation(T, "g", "G", ["a", "b"])
    log.app.mark_read(T, "g", "b", 0)
    log.app.mark_read(T, "g", "a", 0)
    log.app.mark_read(T, "g", "b", 0)  # the read seq does not move: nothing more in b's stream
    keys = RoutingKeys(log.app)
    notes = log.app.recorder.select_notifications(start=0, limit=100)
    conversation_key = str(Conversation.create_id(T, "g"))
    reads = [n for n in notes if "MemberReadState" in n.topic]
    assert len(reads) == 2
    assert {keys.key(n) for n in reads} == {conversation_key}
    assert {keys.key(n) for n in notes if n.originator_id == Conversation.create_id(T, "g")} == {conversation_key}
    assert keys.key(reads[0]) == conversation_key  # again, from the cache
