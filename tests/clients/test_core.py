"""The SDK's pure parts: merged ranges, the backoff, the close-code table and the core's
reaction to a HEAD ahead of what it holds (no server: these are the rules the transport
tests above rely on)."""

from __future__ import annotations

import random

from fanout_client.backoff import backoff_delay, retry_delay
from fanout_client.core import Phase, Send, SyncCore
from fanout_client.errors import Action, Closed, action_for_close, api_error
from fanout_client.ranges import RangeSet
from fanout_client.state import ClientState


def test_ranges_merge_and_report_what_is_missing() -> None:
    held = RangeSet([[5, 7], [1, 2]])
    assert held.add(3) and not held.add(3)  # a repeat is not new
    assert held.as_lists() == [[1, 3], [5, 7]]
    held.add_range(4, 4)
    assert held.as_lists() == [[1, 7]] and held.missing(0, 10) == [(0, 0), (8, 10)]
    assert RangeSet([[2, 3], [6, 6]]).missing(1, 7) == [(1, 1), (4, 5), (7, 7)]


def test_backoff_is_jittered_capped_and_floored_by_the_servers_hint() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(a, rng) for a in range(12)]
    assert all(0 <= d <= 30 for d in delays) and len(set(delays)) == len(delays)
    assert all(2.0 <= retry_delay(2.0, 0, rng) <= 2.2 for _ in range(50))


def test_each_close_code_and_refusal_maps_to_one_action() -> None:
    unauth = api_error("UNAUTHENTICATED", "expired")
    busy = api_error("UNAVAILABLE", "busy", {"reason": "too_many_connections", "retry_after_ms": 1000})
    assert action_for_close(Closed(1008, "UNAUTHENTICATED", unauth)) is Action.REAUTH
    assert action_for_close(Closed(1008, "FORBIDDEN", api_error("FORBIDDEN", "role"))) is Action.GIVE_UP
    assert action_for_close(Closed(1013, "UNAVAILABLE", busy)) is Action.RETRY
    assert action_for_close(Closed(1001, "server shutdown")) is Action.RESUME
    assert action_for_close(Closed(1006)) is Action.RESUME and action_for_close(Closed(None)) is Action.RESUME
    never = api_error("FANOUT_QUOTA_EXCEEDED", "too big", {"retry_after_ms": -1})
    assert action_for_close(Closed(1013, "", never)) is Action.GIVE_UP


def test_a_head_ahead_of_what_is_held_pulls_exactly_the_missing_range() -> None:
    core = SyncCore(ClientState())
    core.connect("t")
    core.receive({"type": "AUTH_OK", "user_id": "bob", "tenant": "acme"})
    session = {"conversation_id": "c", "write_policy": "always", "latest_conversation_seq": 2,
               "read_conversation_seq": 0, "unread_count": 2, "unread_exact": True, "mention_count": 0,
               "last_activity_id": "m2", "preview": "x"}  # fmt: skip
    core.receive({"type": "SESSION_LIST_BATCH", "sessions": [session], "big_group_heads": [], "last": True})
    entries = [{"cursor": p, "conversation_id": "c", "conversation_seq": s, "mention": False, "flags": 0}
               for p, s in ((3, 1), (5, 2))]  # fmt: skip
    assert core.mailbox_page({"entries": entries, "next_after": 5, "more": False})
    assert core.phase is Phase.LIVE and core.caught_up
    head = {"type": "HEAD", "conversation_id": "c", "latest_conversation_seq": 6, "last_activity_id": "m6",
            "preview": "y"}  # fmt: skip
    sends = [e.frame for e in core.receive(head) if isinstance(e, Send)]
    assert sends == [{"type": "PULL_HISTORY", "conversation_id": "c", "after_seq": 2, "limit": 4}]
    assert not core.caught_up and core.state.conversations["c"].gaps() == [(3, 6)]
