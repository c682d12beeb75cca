"""ADR-0003's re-review conditions as watched (domain/rereview.py, fanout/rereview.py,
ADR-0026): each condition's red, green or unknown from its measures, and one review per
episode even with several watches (API replicas) evaluating the same views."""

from __future__ import annotations

import dataclasses
from typing import Any

from adapters.memory import MemoryViews
from domain.params import Parameters
from domain.rereview import MIN_COST_ENTRIES, Measures, advance, read
from fanout.rereview import ReReviewWatch
from projections.capacity import CapacityProjection
from projections.state import UserConversationState

HOLD = 60.0
PARAMS = dataclasses.replace(Parameters(), rereview_hold=HOLD, mailbox_unit_cost_estimate_us=2.0)


def measures(now: float, *, t1: bool = False, t2: bool = False, seconds: float | None = None, entries: int = 0,
             alpha: float | None = None, large: int = 0) -> Measures:  # fmt: skip
    return Measures(now, {"T1": t1, "T2": t2}, seconds, entries, alpha, large)


def states(memo: dict[str, Any], m: Measures) -> dict[int, str]:
    return {r.condition: r.state for r in read(PARAMS, memo, m)}


def test_condition_1_is_red_only_once_t1_or_t2_has_fired_without_a_break_for_the_hold() -> None:
    memo: dict[str, Any] = {}
    for now, firing, expected in (
        (0.0, True, "green"),
        (30.0, True, "green"),
        (60.0, True, "red"),
        (61.0, False, "green"),
    ):
        m = measures(now, t1=firing)
        assert states(memo, m)[1] == expected, now
        memo, _ = advance(memo, read(PARAMS, memo, m), now)
    # a break restarts the count: T2 from 100 s is not red at 150 s
    for now in (100.0, 150.0):
        m = measures(now, t2=True)
        assert states(memo, m)[1] == "green"
        memo, _ = advance(memo, read(PARAMS, memo, m), now)
    assert states(memo, measures(160.0, t2=True))[1] == "red"


def test_condition_4_judges_the_unit_cost_against_three_times_the_estimate_over_enough_entries() -> None:
    assert states({}, measures(0, seconds=None))[4] == "unknown"  # not measured by this process
    assert states({}, measures(0, seconds=1.0, entries=MIN_COST_ENTRIES - 1))[4] == "unknown"
    n = 10_000
    assert states({}, measures(0, seconds=n * 5.9e-6, entries=n))[4] == "green"  # 5.9 us <= 3 x 2 us
    (four,) = [r for r in read(PARAMS, {}, measures(0, seconds=n * 6.1e-6, entries=n)) if r.condition == 4]
    assert four.state == "red" and abs((four.value or 0) - 6.1) < 1e-9 and four.limit == 6.0


def test_condition_7_is_red_when_the_large_buckets_mean_alpha_is_above_the_assumption() -> None:
    assert states({}, measures(0, alpha=None))[7] == "unknown"
    assert states({}, measures(0, alpha=0.5, large=3))[7] == "green"
    assert states({}, measures(0, alpha=0.51, large=3))[7] == "red"


def test_one_episode_per_red_stretch_and_a_new_one_after_green() -> None:
    memo: dict[str, Any] = {}
    turned_all = []
    for now, alpha in ((0, 0.9), (1, 0.9), (2, 0.9), (3, 0.1), (4, 0.8), (5, 0.8)):
        memo, turned = advance(memo, read(PARAMS, memo, measures(now, alpha=alpha, large=1)), now)
        turned_all += turned
    assert turned_all == [(7, 1), (7, 2)]
    assert memo["episodes"] == {"7": 2}


class FakeApp:
    def __init__(self) -> None:
        self.opened: list[tuple[str, str, str, str | None]] = []

    def open_review(self, tenant: str, size_bucket: str, trigger: str, details: dict[str, Any], opened_by: str,
                    review_key: str | None = None) -> dict[str, Any]:  # fmt: skip
        self.opened.append((tenant, size_bucket, trigger, review_key))
        return {}


class FakeRuntime:
    def __init__(self, views: MemoryViews, window: CapacityProjection, app: FakeApp) -> None:
        self.params = PARAMS
        self.views = views
        self.window = window
        self.app = app

    def capacity(self) -> CapacityProjection:
        return self.window

    def mailbox_cost(self) -> tuple[float | None, int]:
        return None, 0


def test_two_watches_over_one_store_open_one_review_per_episode_scoped_to_the_dominant_tenant() -> None:
    views = MemoryViews()
    window = CapacityProjection(PARAMS)
    window.observe(999.0, "acme", "small", 100, 1)
    window.observe(999.5, "globex", "medium", 10, 2)
    window.firing = {"T1": True}
    app = FakeApp()
    clock = [1000.0]
    watches = [ReReviewWatch(FakeRuntime(views, window, app), clock=lambda: clock[0]) for _ in range(2)]  # type: ignore[arg-type]
    for t in (1000.0, 1030.0, 1061.0, 1062.0, 1063.0):
        clock[0] = window.last_at = t  # sends keep the window live
        for w in watches:
            w.evaluate()
    assert app.opened == [("acme", "small", "rereview_1", "rereview/1/1")]
    assert watches[0].last is not None and watches[0].last["conditions"][0]["state"] == "red"
    window.firing = {"T1": False}
    clock[0] = 1070.0
    watches[1].evaluate()
    window.firing = {"T1": True}
    for t in (1071.0, 1140.0):
        clock[0] = window.last_at = t
        for w in watches:
            w.evaluate()
    assert [key for *_, key in app.opened] == ["rereview/1/1", "rereview/1/2"]


def test_a_trigger_left_firing_by_a_window_with_no_sends_does_not_hold() -> None:
    """The window is in event time: after the last send its flags stay as they were, but
    nothing is written; condition 1 counts only while the window is live."""
    views = MemoryViews()
    window = CapacityProjection(PARAMS)
    window.observe(0.0, "acme", "small", 100, 1)
    window.firing = {"T1": True}
    clock = [0.0]
    watch = ReReviewWatch(FakeRuntime(views, window, FakeApp()), clock=lambda: clock[0])  # type: ignore[arg-type]
    for t in (0.0, 30.0, 200.0):  # the last send at 0: live for one capacity window only
        clock[0] = t
        last = watch.evaluate()
    assert last["conditions"][0]["state"] == "green"
    assert last["conditions"][0]["details"]["firing"] == {"T1": False, "T2": False}


def test_the_mailbox_meter_counts_the_fan_out_writes_the_views_report_only() -> None:
    """The views the composition root builds tell the meter (a MailboxTimer) how long each
    mailbox write of a unit took; it counts the writes of large messages only."""
    from fanout.rereview import MailboxMeter
    from projections.ports import MessageRefs

    meter = MailboxMeter(at_least=5)
    views = MemoryViews(timer=meter)
    small = MessageRefs("c", 1, 1, 0, {}, {0: ["a", "b"]})
    big = MessageRefs("c", 2, 2, 0, {}, {0: [f"u{i}" for i in range(4)], 1: ["v", "w"]})
    with views.unit_of_work() as w:
        w.put_mailbox("acme", small)
    assert (meter.seconds, meter.entries) == (0.0, 0)
    with views.unit_of_work() as w:
        w.put_mailbox("acme", big)
    assert meter.entries == 6 and meter.seconds > 0
    assert views.mailbox.count() == 8


def test_the_watch_reads_the_states_of_the_large_buckets_conversations_alone() -> None:
    """Condition 7 looks at the large bucket only: every API replica refreshes it every
    ALPHA_REFRESH s, and reading every conversation's members (most of them in small groups)
    for it cost a serve process a sixth of its CPU in the login bench (PERFORMANCE.md 25)."""
    from tests.contract.test_view_store import head

    class CountingViews(MemoryViews):
        def __init__(self) -> None:
            super().__init__()
            self.read: list[str] = []

        def conversation_activity(self, tenant: str | None, size_bucket: str | None = None) -> Any:
            for row in super().conversation_activity(tenant, size_bucket):
                self.read.append(row[1])
                yield row

    views = CountingViews()
    with views.unit_of_work() as w:
        w.put_head("acme", "big", {**head("big", tenant="acme"), "size_bucket": "large"})
        w.put_states("acme", "big", [("u", UserConversationState(0, 0, last_active=999.0)),
                                     ("v", UserConversationState(0, 0, last_active=0.0))])  # fmt: skip
        for i in range(50):
            w.put_head("acme", f"s{i}", head(f"s{i}", tenant="acme"))
            w.put_states("acme", f"s{i}", [("u", UserConversationState(0, 0, last_active=999.0))])
    watch = ReReviewWatch(FakeRuntime(views, CapacityProjection(PARAMS), FakeApp()), clock=lambda: 1000.0)  # type: ignore[arg-type]
    assert watch.large_alpha(1000.0) == (0.5, 1)
    assert views.read == ["big"]
