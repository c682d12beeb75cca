"""Explicit examples of the tricky paths of invariants G, U, M, H and A, on the real
embedded runtime (SQLite event store and views, projections run synchronously)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from domain.delivery import MENTION
from domain.errors import RateLimited
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from tests.integration.conftest import FakeClock, Harness
from tests.integration.test_invariants_stateful import MIN_INTERVAL, PARAMS, WINDOW

T = "t"


@pytest.fixture
def h(make_harness) -> Harness:
    return make_harness(PARAMS)


def session(h: Harness, user: str, cid: str = "c") -> dict[str, Any]:
    sessions, _ = h.queries.session_list(T, user)
    (item,) = [s for s in sessions if s["conversation_id"] == cid]
    return item


def mailbox_seqs(h: Harness, user: str, cid: str = "c") -> list[int]:
    page = h.queries.mailbox(T, user, 0, 1000)
    return [e["conversation_seq"] for e in page["entries"] if e["conversation_id"] == cid]


def pull_history(h: Harness, user: str, after: int, cid: str = "c") -> list[int]:
    page = h.queries.history(T, cid, user, after, 1000)
    return [m["conversation_seq"] for m in page["messages"]]


def enable(h: Harness, bucket: str = "small", min_saving: float = 1.5, ratio: float = 0.5) -> None:
    rid = h.app.open_review(T, bucket, "manual", {}, "admin")["review_id"]
    h.app.decide_review(T, rid, "enable_mention_only", "admin", min_saving, ratio)
    h.settle()


def send(h: Harness, clock: FakeClock, sender: str, cid: str = "c", **kw: Any) -> dict[str, Any]:
    clock.advance(3.0)  # past the per-sender rate of 1 msg / 3 s
    out = h.app.send_message(T, cid, sender=sender, text=f"from {sender}", **kw)
    h.settle()
    return out


@pytest.fixture
def in_mention_only(h: Harness, clock: FakeClock) -> Harness:
    """c = {a, b, d}, nobody active, small tier enabled: the tier change enters mention_only."""
    h.app.create_conversation(T, "c", "", ["a", "b", "d"])
    h.settle()  # the tier change evaluates the conversations of its scope, read from the views
    enable(h)
    assert h.queries.head(T, "c")["write_policy"] == "mention_only"
    return h


def test_skipped_silent_member_rollback_pull_history_then_mark_read_makes_unread_exact(in_mention_only, clock):
    h = in_mention_only
    assert send(h, clock, "a")["write_policy"] == "mention_only"  # seq 1: b and d are silent
    b = session(h, "b")
    assert mailbox_seqs(h, "b") == []
    assert b["unread_exact"] is False
    assert b["unread_count"] == 1
    assert b["delivered_conversation_seq"] == 0

    # rollback: back to always at once, although the last switch was < MIN_INTERVAL ago
    out = h.app.roll_back_tier(T, "small", "admin", "incident")
    assert out["returned_to_always"] == ["c"]
    h.settle()
    assert send(h, clock, "a")["write_policy"] == "always"  # seq 2: everyone again
    assert mailbox_seqs(h, "b") == [2]  # not backfilled
    b = session(h, "b")
    assert b["unread_exact"] is False, "still an estimate until MARK_READ or REBUILD"
    assert b["delivered_conversation_seq"] == 0

    # the protocol: PULL_HISTORY from delivered_conversation_seq closes the gap in the client
    held = set(mailbox_seqs(h, "b")) | set(pull_history(h, "b", b["delivered_conversation_seq"]))
    assert held == {1, 2}
    h.app.mark_read(T, "c", "b", max(held))
    h.settle()
    b = session(h, "b")
    assert b["unread_exact"] is True
    assert b["unread_count"] == 0
    # the mailbox still lacks seq 1: the gap stays flagged for the user's other devices (ADR 0002)
    assert b["delivered_conversation_seq"] == 0

    # d never synced: still flagged, so its next sync pulls the gap too
    d = session(h, "d")
    assert d["unread_exact"] is False and d["delivered_conversation_seq"] == 0 and d["unread_count"] == 2


def test_a_mention_of_a_silent_member_is_materialized_and_counted_once(in_mention_only, clock):
    h = in_mention_only
    send(h, clock, "a", mentions=["b", "b", "stranger"])  # seq 1
    send(h, clock, "a", reply_to_seq=1)  # seq 2: a replies to itself: nobody else is mentioned
    send(h, clock, "a", mentions=["b"], mention_all=True)  # seq 3: @all and @b counts once
    entries = h.queries.mailbox(T, "b", 0, 100)["entries"]
    assert [(e["conversation_seq"], bool(e["flags"] & MENTION)) for e in entries] == [(1, True), (3, True)]
    b = session(h, "b")
    assert b["mention_count"] == 2
    assert session(h, "d")["mention_count"] == 1  # the @all
    assert session(h, "a")["mention_count"] == 0  # own messages never count


def test_a_reply_to_a_silent_member_is_materialized_and_counted(in_mention_only, clock):
    h = in_mention_only
    h.app.mark_read(T, "c", "b", 0)  # b becomes active for a moment
    send(h, clock, "b")  # seq 1 by b
    clock.advance(WINDOW + 1)  # b silent again
    send(h, clock, "a", reply_to_seq=1)  # seq 2 replies to b
    assert mailbox_seqs(h, "b") == [1, 2]
    assert session(h, "b")["mention_count"] == 1


def test_rebuild_of_a_skipped_member_makes_unread_exact_and_keeps_the_gap_flagged(in_mention_only, clock):
    h = in_mention_only
    send(h, clock, "a")
    send(h, clock, "a")
    h.app.request_rebuild(T, "c", "b")
    h.settle()
    b = session(h, "b")
    assert b["unread_exact"] is True and b["unread_count"] == 2
    # the mailbox still stops at delivered_conversation_seq, and says so
    assert b["delivered_conversation_seq"] == 0
    assert pull_history(h, "b", b["delivered_conversation_seq"]) == [1, 2]


def test_a_skipped_member_that_leaves_and_rejoins_starts_clean(in_mention_only, clock):
    h = in_mention_only
    send(h, clock, "a")
    h.app.remove_member(T, "c", "b")
    h.settle()
    assert [s["conversation_id"] for s in h.queries.session_list(T, "b")[0]] == []
    h.app.add_members(T, "c", ["b"])
    h.settle()
    b = session(h, "b")
    assert b["read_conversation_seq"] == 1 and b["unread_count"] == 0 and b["mention_count"] == 0
    assert b["unread_exact"] is True


def test_a_restart_mid_gap_keeps_the_gap_and_keeps_skipping(in_mention_only, clock):
    h = in_mention_only
    send(h, clock, "a")
    before = session(h, "b")
    h.restart()
    assert session(h, "b") == before
    send(h, clock, "a")
    b = session(h, "b")
    assert b["delivered_conversation_seq"] == 0 and b["unread_count"] == 2 and b["unread_exact"] is False
    assert mailbox_seqs(h, "b") == []
    assert h.queries.delivery(T, "c", 2)["mailbox_entries"] == 1


def test_a_member_active_again_gets_entries_and_its_gap_is_bounded(in_mention_only, clock):
    h = in_mention_only
    send(h, clock, "a")  # 1: b skipped
    h.app.mark_read(T, "c", "b", 0)  # b is active again (but does not hold 1)
    send(h, clock, "a")  # 2: b materialized, the gap is (0, 1]
    assert mailbox_seqs(h, "b") == [2]
    b = session(h, "b")
    assert b["unread_exact"] is False and b["delivered_conversation_seq"] == 0
    assert pull_history(h, "b", 0) == [1, 2]
    h.app.mark_read(T, "c", "b", 2)
    h.settle()
    assert session(h, "b")["unread_exact"] is True


def test_no_switch_back_within_the_min_interval_but_at_the_next_evaluation_after_it(in_mention_only, clock):
    h = in_mention_only
    entered_at = clock.now
    for u in ("a", "b", "d"):  # everyone active: alpha = 1 >= ratio, exit is due ...
        h.app.mark_read(T, "c", u, 0)
    assert h.app.evaluate_conversation(T, "c") == "mention_only"  # ... but not within MIN_INTERVAL
    clock.now = entered_at + MIN_INTERVAL
    assert h.app.evaluate_conversation(T, "c") == "always"


def test_a_client_msg_id_retry_after_a_restart_returns_the_same_seq(h, clock):
    h.app.create_conversation(T, "c", "", ["a", "b"])
    first = send(h, clock, "a", client_msg_id="k1")
    h.restart()
    again = h.app.send_message(T, "c", sender="a", text="from a", client_msg_id="k1")
    assert again["conversation_seq"] == first["conversation_seq"] and again["duplicate"] is True
    h.settle()
    assert mailbox_seqs(h, "b") == [1]


def test_a_conversation_rate_below_one_message_per_second_still_admits_messages(make_harness, clock):
    """rate_large=0.5 msg/s is a legal setting (FANOUT_RATE_LARGE); a large group must still be
    able to send one message every 2 s, not be refused forever with retry_after_ms=-1."""
    h = make_harness(replace(PARAMS, rate_large=0.5))
    h.app.create_conversation(T, "c", "", [f"u{i}" for i in range(10)])  # large: > 8
    try:
        out = h.app.send_message(T, "c", sender="u0", text="hello")
    except RateLimited as exc:
        pytest.fail(f"the first message of a 0.5 msg/s conversation was refused: {exc.details}")
    assert out["conversation_seq"] == 1
    clock.advance(2.0)
    assert h.app.send_message(T, "c", sender="u1", text="again")["conversation_seq"] == 2


def test_state_survives_aggregate_snapshots_and_a_restart(in_mention_only, clock):
    """Past the Conversation snapshot interval (200 events) a restart loads from a snapshot:
    policy, its scope, the tier's roster and client_msg_ids must all survive it."""
    h = in_mention_only
    for i in range(205):
        clock.advance(3.0)
        h.app.send_message(T, "c", sender="a", text=f"n{i}", client_msg_id=f"k{i}")
    h.settle()
    assert h.app.conversation(T, "c").version > 200
    h.restart()
    assert h.app.send_message(T, "c", sender="a", text="x", client_msg_id="k3")["conversation_seq"] == 4
    b = session(h, "b")
    assert b["write_policy"] == "mention_only"
    assert b["unread_count"] == 205 and b["delivered_conversation_seq"] == 0
    out = h.app.roll_back_tier(T, "small", "admin", "after snapshot")
    assert out["returned_to_always"] == ["c"]
    h.settle()
    assert h.queries.head(T, "c")["write_policy"] == "always"


class Device:
    """One client device of a user, following the sync protocol (session list, mailbox from
    its own cursor, PULL_HISTORY for every flagged range)."""

    def __init__(self, h: Harness, user: str) -> None:
        self.h, self.user, self.cursor, self.held = h, user, 0, set()

    def sync(self, cid: str = "c") -> set[int]:
        sessions, _ = self.h.queries.session_list(T, self.user)
        page = self.h.queries.mailbox(T, self.user, self.cursor, 1000)
        self.held |= {e["conversation_seq"] for e in page["entries"] if e["conversation_id"] == cid}
        self.cursor = page["next_after"]
        for s in sessions:
            d = s.get("delivered_conversation_seq")
            if s["conversation_id"] == cid and d is not None and d < s["latest_conversation_seq"]:
                self.held |= set(pull_history(self.h, self.user, d, cid))
        return self.held

    def mark_read(self, seq: int, cid: str = "c") -> None:
        assert seq in self.held, "the protocol only marks read what the device holds"
        self.h.app.mark_read(T, cid, self.user, seq)
        self.h.settle()


def test_a_second_device_of_a_user_finds_a_gap_that_the_first_device_closed(in_mention_only, clock):
    """G with two devices: device X pulls the gap and MARK_READs through it, which clears
    delivered_conversation_seq for the *user*; device Y, offline until now, then syncs by the
    same protocol and must still end with the full history (seq 1 was never in the mailbox)."""
    h = in_mention_only
    x, y = Device(h, "b"), Device(h, "b")
    send(h, clock, "a")  # 1: b silent, skipped
    assert x.sync() == {1}  # flagged, pulled
    x.mark_read(1)  # b is active again
    send(h, clock, "a")  # 2: materialized for b; the gap is (0, 1]
    assert x.sync() == {1, 2}
    x.mark_read(2)  # closes the gap: x holds everything through 2
    assert y.sync() == {1, 2}, "device Y misses seq 1 and nothing tells it so (undetectable gap)"


def test_leaving_and_rejoining_does_not_reset_the_per_sender_rate(h, clock):
    """A: accepted rate per (sender, conversation) never exceeds 1 msg / 3 s, even across a
    leave and a rejoin (the sender's bucket must not be handed out fresh)."""
    h.app.create_conversation(T, "c", "", ["a", "b"])
    h.app.send_message(T, "c", sender="a", text="one")
    h.app.remove_member(T, "c", "a")
    h.app.add_members(T, "c", ["a"])
    with pytest.raises(RateLimited) as info:
        h.app.send_message(T, "c", sender="a", text="two, at the same instant")
    assert info.value.details["gate"] == "per_sender_in_conversation_rate"


def test_a_send_and_later_membership_changes_in_one_projection_batch_deliver_to_the_members_at_send(h, clock):
    """D with a projector behind the log: the send, a join and a leave are applied in ONE
    unit of work. The send's recipients are the members when it was sent (b, not x)."""
    h.app.create_conversation(T, "c", "", ["a", "b"])
    h.settle()
    clock.advance(3.0)
    sent = h.app.send_message(T, "c", sender="a", text="before the changes")
    h.app.add_members(T, "c", ["x"])
    h.app.remove_member(T, "c", "b")
    h.settle()  # one batch: sent, joined, left
    assert [e["conversation_seq"] for e in h.queries.mailbox(T, "b", 0, 10)["entries"]] == [sent["conversation_seq"]]
    assert h.queries.mailbox(T, "x", 0, 10)["entries"] == []
    assert mailbox_seqs(h, "a") == [sent["conversation_seq"]]
    assert h.queries.delivery(T, "c", sent["conversation_seq"])["mailbox_entries"] == 2


def test_verify_and_rebuild_agree_with_live_after_membership_changes_that_follow_a_send(h, clock):
    from tools.rebuild import verify

    h.app.create_conversation(T, "c", "", ["a", "b"])
    h.settle()
    clock.advance(3.0)
    h.app.send_message(T, "c", sender="a", text="hi")
    h.settle()
    h.app.add_members(T, "c", ["x"])
    h.app.remove_member(T, "c", "b")
    h.settle()
    h.close()
    report = verify(Settings.embedded(h.data_dir, h.params), progress=False)
    assert report.equal, report.differences


def test_a_log_written_when_review_lived_in_domain_tier_still_projects_and_verifies(h, clock):
    """Review moved from domain/tier.py to domain/review.py: stored topics of older logs say
    domain.tier:Review.*; they must still resolve, be projected and be verified."""
    import sqlite3

    from tools.rebuild import rebuild, verify

    rid = h.app.open_review(T, "small", "manual", {}, "admin")["review_id"]
    h.app.decide_review(T, rid, "enable_mention_only", "admin", 1.5, 0.5)
    h.close()
    con = sqlite3.connect(h.data_dir / "events.sqlite")
    changed = con.execute(
        "UPDATE stored_events SET topic = replace(topic, 'domain.review:Review', 'domain.tier:Review') "
        "WHERE topic LIKE 'domain.review:Review%'"
    ).rowcount
    con.commit()
    con.close()
    assert changed == 2  # Opened, Decided
    rebuild(Settings.embedded(h.data_dir, h.params), "all", progress=False)
    report = verify(Settings.embedded(h.data_dir, h.params), progress=False)
    assert report.equal, report.differences
    h.rt = bootstrap(Settings.embedded(h.data_dir, h.params), clock=clock)
    h.settle()
    (review,) = h.rt.views.reviews(T)
    assert review["status"] == "decided" and review["decision"] == "enable_mention_only"


def test_a_reply_to_a_message_the_views_have_not_applied_yet_still_counts_for_its_sender(h, clock):
    """M with a projector behind the log: the replied-to sender is found in the event
    store when the views do not hold the message yet."""
    h.app.create_conversation(T, "c", "", ["a", "b"])
    h.settle()
    clock.advance(3.0)
    first = h.app.send_message(T, "c", sender="a", text="question")
    clock.advance(3.0)
    h.app.send_message(T, "c", sender="b", text="answer", reply_to_seq=first["conversation_seq"])
    h.settle()  # both in one batch: the reply was resolved before the views had message 1
    assert session(h, "a")["mention_count"] == 1
    assert mailbox_seqs(h, "a") == [1, 2]
