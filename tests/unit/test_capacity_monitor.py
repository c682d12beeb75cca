"""CapacityMonitor: T1/T2 over the merged windows of several log partitions (ADR-0020).
The partitions' windows are CapacityProjections fed directly (`observe`) and saved in
memory views, as the workers save them."""

from __future__ import annotations

import dataclasses

from adapters.memory import MemoryViews
from domain.params import Parameters
from projections.capacity import CapacityProjection
from projections.capacity_monitor import MONITOR_STATE, CapacityMonitor

T = "acme"
# T1 = 0.7 x 10 = 7 entries/s over a 10 s window; T2 out of reach.
PARAMS = dataclasses.replace(Parameters(), capacity_window=10.0, platform_fanout_budget=10.0, mailbox_write_budget=1e9)
PARTITIONS = 3
T0 = 1_800_000_000.0


class Partitions:
    """One counting-only CapacityProjection per log partition, saved after each feed."""

    def __init__(self, views: MemoryViews) -> None:
        self.views = views
        self.windows = [CapacityProjection(PARAMS, views, partition=p, triggers=False) for p in range(PARTITIONS)]
        self.position = 0
        self.own_triggers: list[object] = []

    def feed(self, start: float, seconds: int, per_partition_per_second: int) -> None:
        """Each partition sees `per_partition_per_second` entries each second (one message)."""
        for s in range(seconds):
            for window in self.windows:
                self.position += 1
                self.own_triggers += window.observe(T0 + start + s, T, "small", per_partition_per_second, self.position)
        with self.views.unit_of_work() as w:
            for window in self.windows:
                w.put_capacity(window.state_name, window.state())


def test_the_platform_rate_is_the_sum_over_partitions() -> None:
    views = MemoryViews()
    parts = Partitions(views)
    monitor = CapacityMonitor(PARAMS, views, PARTITIONS)
    parts.feed(0, 5, 3)
    assert monitor.evaluate() == []  # 9/s, but not yet a whole window
    parts.feed(5, 8, 3)  # 3/s per partition (each under 7/s), 9/s in all, over 12 s
    (t,) = monitor.evaluate()
    assert (t.trigger, t.tenant, t.size_bucket, t.review_key) == ("T1", T, "small", "T1/merged/1")
    assert t.details["limit"] == 7.0 and t.details["rate"] > 7.0 and t.details["partitions"] == PARTITIONS
    assert parts.own_triggers == []  # the partitions only count

    # The same partitions evaluated one by one (what the workers did before) never fire.
    for window in parts.windows:
        alone = CapacityProjection(PARAMS, state=views.capacity_state(window.state_name))
        assert alone.crossings()[0][1] < 7.0


def test_an_episode_fires_once_across_evaluations_and_monitors() -> None:
    views = MemoryViews()
    parts = Partitions(views)
    parts.feed(0, 12, 3)
    assert [t.review_key for t in CapacityMonitor(PARAMS, views, PARTITIONS).evaluate()] == ["T1/merged/1"]
    assert CapacityMonitor(PARAMS, views, PARTITIONS).evaluate() == []  # another worker took over
    parts.feed(12, 3, 3)
    assert CapacityMonitor(PARAMS, views, PARTITIONS).evaluate() == []  # still over: the same episode
    saved = views.capacity_state(MONITOR_STATE)
    assert saved == {"firing": {"T1": True, "T2": False}, "episodes": {"T1": 1}}

    parts.feed(15, 12, 1)  # 3/s in all: under the limit, the episode ends
    assert CapacityMonitor(PARAMS, views, PARTITIONS).evaluate() == []
    assert views.capacity_state(MONITOR_STATE)["firing"]["T1"] is False  # type: ignore[index]
    parts.feed(27, 12, 4)  # 12/s: a new episode, a new review
    assert [t.review_key for t in CapacityMonitor(PARAMS, views, PARTITIONS).evaluate()] == ["T1/merged/2"]


class PausedBeforeSave(MemoryViews):
    """Views whose compare-and-set first lets another monitor run (this one was paused
    between reading the memo and saving it, and partition 0 moved meanwhile)."""

    other: CapacityMonitor | None = None

    def compare_and_put_capacity(self, name: str, expected: object, body: object) -> bool:
        if self.other is not None:
            other, self.other = self.other, None
            other.evaluate()
        return super().compare_and_put_capacity(name, expected, body)  # type: ignore[arg-type]


def test_a_monitor_paused_before_its_save_never_rewinds_the_memo_nor_fires_twice() -> None:
    views = PausedBeforeSave()
    parts = Partitions(views)
    parts.feed(0, 12, 3)  # T1 over: episode 1
    stale, current = CapacityMonitor(PARAMS, views, PARTITIONS), CapacityMonitor(PARAMS, views, PARTITIONS)
    views.other = current
    assert stale.evaluate() == []  # its save failed: the other one saved episode 1 first
    assert stale.fenced == 1
    assert views.capacity_state(MONITOR_STATE) == {"firing": {"T1": True, "T2": False}, "episodes": {"T1": 1}}
    parts.feed(12, 12, 1)  # the episode ends; evaluated by the stale one, now up to date
    assert stale.evaluate() == [] and stale.fenced == 1
    parts.feed(24, 12, 4)
    assert [t.review_key for t in stale.evaluate()] == ["T1/merged/2"]  # not a second "1"
