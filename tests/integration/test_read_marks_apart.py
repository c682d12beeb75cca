"""MARK_READ apart from the conversation's stream (ADR-0018), on the real embedded runtime
(SQLite event store and views, fake clock): a read appends to the member's
MemberReadState stream only; the activity it is reaches the conversation (alpha, who is
materialized in mention_only) as group-committed Conversation.MembersActive events."""

from __future__ import annotations

import time
from typing import Any

from domain.conversation import Conversation
from domain.params import Parameters
from domain.reads import MemberReadState
from tests.integration.conftest import FakeClock, Harness
from tests.integration.test_invariants_examples import enable, mailbox_seqs, send, session
from tests.integration.test_invariants_stateful import PARAMS

T = "t"


def stream(h: Harness, aggregate_id: Any) -> list[str]:
    return [type(h.app.mapper.to_domain_event(e)).__qualname__ for e in h.app.recorder.select_events(aggregate_id)]


def conversation_stream(h: Harness, cid: str = "c") -> list[str]:
    return stream(h, Conversation.create_id(T, cid))


def hold_activity(h: Harness) -> None:
    """Nothing flushes by itself from here on: the command side's rule and the flusher thread's
    wait both read an hour (the app's attribute alone left the flusher at 0.2 s, and a loaded
    machine's flush landed amid a test's reads)."""
    h.app.activity_flush_interval = 3600.0
    h.app.activity.interval = 3600.0


def wait_for(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_mark_read_appends_nothing_to_the_conversation_while_activity_is_fresh(make_harness, clock: FakeClock) -> None:  # noqa: ANN001
    h = make_harness(Parameters())
    h.app.create_conversation(T, "c", "", ["a", "b"])
    send(h, clock, "b")  # seq 1: b is active (sending is activity, and marks 1 read)
    for _ in range(3):
        send(h, clock, "a")  # seqs 2..4
    before = conversation_stream(h)
    for seq in (2, 3, 4):
        clock.advance(1.0)
        out = h.app.mark_read(T, "c", "b", seq)
        assert out["coalesced"] is False
    assert h.app.pending_activity() == 0 and h.app.flush_activity() == 0
    assert conversation_stream(h) == before  # not one conversation append for three reads
    assert stream(h, MemberReadState.create_id(T, "c", "b")) == [
        "MemberReadState.Created",
        "MemberReadState.ReadMarked",
        "MemberReadState.ReadMarked",
    ]
    h.settle()
    assert states(h, ["b"])[0].read_conversation_seq == 4
    assert session(h, "b", "c")["unread_count"] == 0
    # A read seq never moves back: nothing is appended for an older one.
    h.app.mark_read(T, "c", "b", 3)
    assert len(stream(h, MemberReadState.create_id(T, "c", "b"))) == 3


def test_many_stale_members_reading_cost_one_conversation_append(make_harness, clock: FakeClock) -> None:  # noqa: ANN001
    h = make_harness(Parameters())
    readers = [f"r{i}" for i in range(50)]
    h.app.create_conversation(T, "c", "", ["a", *readers])
    send(h, clock, "a")
    hold_activity(h)
    before = conversation_stream(h)
    for u in readers:
        h.app.mark_read(T, "c", u, 1)
    assert conversation_stream(h) == before
    assert h.app.pending_activity() == len(readers)
    assert h.app.flush_activity() == 1
    assert conversation_stream(h) == [*before, "Conversation.MembersActive"]
    conv = h.app.conversation(T, "c")
    assert all(conv.members[u] == clock.now for u in readers)
    h.settle()
    # the views' activity is the aggregate's (materialization in mention_only depends on it)
    assert all(s.last_active == clock.now for s in states(h, readers))


def states(h: Harness, users: list[str]) -> list[Any]:
    _, all_states, _ = h.rt.views.load_conversation(T, "c")
    return [all_states[u] for u in users]


def test_a_member_who_reads_is_active_for_mention_only_after_the_flush(make_harness, clock: FakeClock) -> None:  # noqa: ANN001
    h = make_harness(PARAMS)
    h.app.create_conversation(T, "c", "", ["a", "b", "d"])
    h.settle()
    enable(h)
    assert h.queries.head(T, "c")["write_policy"] == "mention_only"
    h.app.mark_read(T, "c", "b", 0)  # b becomes active; d stays silent
    wait_for(lambda: h.app.pending_activity() == 0)  # the background flush (every 0.2 s)
    assert conversation_stream(h)[-1] == "Conversation.MembersActive"
    assert h.app.conversation(T, "c").members["b"] > 0.0
    out = send(h, clock, "a")
    assert mailbox_seqs(h, "b") == [out["conversation_seq"]]
    assert mailbox_seqs(h, "d") == []


def test_a_pending_refresh_rides_on_the_next_send_of_the_same_process(make_harness, clock: FakeClock) -> None:  # noqa: ANN001
    h = make_harness(PARAMS)
    h.app.create_conversation(T, "c", "", ["a", "b", "d"])
    h.settle()
    enable(h)
    hold_activity(h)
    h.app.mark_read(T, "c", "b", 0)
    before = conversation_stream(h)
    out = send(h, clock, "a")
    # one save: the activity, then the send that is decided with it
    assert conversation_stream(h) == [*before, "Conversation.MembersActive", "Conversation.MessageSent"]
    assert h.app.pending_activity() == 0
    assert mailbox_seqs(h, "b") == [out["conversation_seq"]]
    assert mailbox_seqs(h, "d") == []


def test_close_appends_the_pending_refreshes(make_harness, clock: FakeClock) -> None:  # noqa: ANN001
    h = make_harness(PARAMS)
    h.app.create_conversation(T, "c", "", ["a", "b"])
    hold_activity(h)
    h.app.mark_read(T, "c", "b", 0)
    h.restart()
    assert conversation_stream(h)[-1] == "Conversation.MembersActive"
    assert h.app.conversation(T, "c").members["b"] > 0.0


def test_a_read_while_a_refresh_is_pending_is_coalesced_like_a_recorded_one(make_harness, clock: FakeClock) -> None:  # noqa: ANN001
    h = make_harness(Parameters())
    h.app.create_conversation(T, "c", "", ["a", "b"])
    send(h, clock, "a")
    hold_activity(h)
    assert h.app.mark_read(T, "c", "b", 1)["coalesced"] is False
    h.settle()  # the views show read seq 1
    top = h.log_top()
    again = h.app.mark_read(T, "c", "b", 1)
    assert again["coalesced"] is True and h.log_top() == top
