"""T1 / T2 only open a review (ADR-0003 decision 3): no metric enables a tier or
switches a conversation. Real embedded runtime, fake clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from domain.params import Parameters, Rate
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from fanout.embedded import EmbeddedRuntime


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


PARAMS = dataclasses.replace(
    Parameters(),
    small_max_members=5,
    medium_max_members=10,
    rate_small=1000,
    rate_medium=1000,
    rate_large=1000,
    per_sender_in_conversation_rate=Rate(1000, 1.0),
    platform_fanout_budget=100.0,  # T1 above 70 entries/s
    mailbox_write_budget=100.0,  # T2 above 50 large-group entries/s
    capacity_window=10.0,
)


def send_for(rt: EmbeddedRuntime, clock: Clock, cid: str, seconds: float, per_second: int) -> None:
    for _ in range(int(seconds * per_second)):
        clock.t += 1.0 / per_second
        rt.app.send_message("acme", cid, sender="u0", text="load")
    rt.runner.catch_up()


def test_sustained_fanout_over_t1_opens_one_review_and_switches_nothing(tmp_path: Path) -> None:
    clock = Clock()
    with bootstrap(Settings.embedded(tmp_path, PARAMS), clock=clock) as rt:
        rt.app.create_conversation("acme", "g", "", [f"u{i}" for i in range(4)])  # small: 4 entries / message
        send_for(rt, clock, "g", seconds=5, per_second=10)  # 40 entries/s: under T1
        assert rt.views.reviews("acme") == []
        send_for(rt, clock, "g", seconds=12, per_second=25)  # 100 entries/s for a whole window
        reviews = rt.views.reviews("acme")
        assert [(r["trigger"], r["size_bucket"], r["status"]) for r in reviews] == [("T1", "small", "open")]
        assert rt.review_triggers == 1
        send_for(rt, clock, "g", seconds=5, per_second=25)  # still over: no second review while it fires
        assert len(rt.views.reviews("acme")) == 1
        assert all(t["state"] == "disabled" for t in rt.app.tiers("acme"))
        assert rt.queries.head("acme", "g")["write_policy"] == "always"


def test_big_group_writes_over_t2_open_a_review_for_the_large_bucket(tmp_path: Path) -> None:
    clock = Clock()
    with bootstrap(Settings.embedded(tmp_path, PARAMS), clock=clock) as rt:
        rt.app.create_conversation("acme", "big", "", [f"u{i}" for i in range(20)])  # large: 20 entries / message
        send_for(rt, clock, "big", seconds=12, per_second=3)  # 60 entries/s: T2 (>50) but not T1 (>70)
        reviews = rt.views.reviews("acme")
        assert [(r["trigger"], r["size_bucket"]) for r in reviews] == [("T2", "large")]
        assert rt.app.tier_terms("acme", "large").enabled is False
        assert rt.queries.head("acme", "big")["write_policy"] == "always"


def test_a_replayed_trigger_does_not_open_the_review_twice(tmp_path: Path) -> None:
    clock = Clock()
    with bootstrap(Settings.embedded(tmp_path, PARAMS), clock=clock) as rt:
        rt.app.create_conversation("acme", "g", "", [f"u{i}" for i in range(4)])
        send_for(rt, clock, "g", seconds=12, per_second=25)
        (review,) = rt.views.reviews("acme")
        key_review = rt.app.open_review(
            "acme", review["size_bucket"], "T1", {}, "replay", review_key=f"T1/acme/small/{_trigger_position(rt)}"
        )
        assert key_review["review_id"] == review["review_id"]


def _trigger_position(rt: EmbeddedRuntime) -> int:
    """The log position whose MessageSent crossed T1 (the review key's suffix)."""
    from domain.review import Review

    for n in rt.app.recorder.select_notifications(start=1, limit=10_000):
        e = rt.app.mapper.to_domain_event(n)
        if isinstance(e, Review.Opened):
            return int(e.review_key.rsplit("/", 1)[1])
    raise AssertionError("no review opened")
