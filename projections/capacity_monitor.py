"""T1/T2 over the whole platform when the log has several partitions (ADR decision 3,
ADR-0020).

In the distributed runtime each log partition's `CapacityProjection` keeps only its share
of the traffic (`capacity.p<N>`). The platform's fan-out rate is the sum over partitions:
evaluating T1/T2 per partition fired late or never (six partitions each under 70 % of the
budget can together be far over it). The per-partition projections there only count
(`CapacityProjection(..., triggers=False)`); this monitor reads every partition's saved
window, merges them (`capacity.merged`) and applies the same rule as the projection
(`CapacityProjection.crossings`): a trigger fires when its rate is over the limit over a
whole window and was not over at the previous evaluation.

Its memory (which triggers are firing, how many episodes each has had) is saved in the
views under `capacity.monitor` by a compare-and-set against the memo it read (a monitor that
was paused while another took partition 0 over never rewinds it, and drops its evaluation), so the next evaluation, in this process or in the worker
that takes its place, does not fire the same episode again. The review opened for an
episode is keyed by (trigger, episode number): two monitors evaluating the same episode at
once during a rebalance open ONE review (the event store dedupes by review key).

Pure of engines: the host decides when to call `evaluate` (the worker: once a second, on
the worker holding log partition 0, on its views thread)."""

from __future__ import annotations

from typing import Any

from domain.params import Parameters
from projections.capacity import CapacityProjection, ReviewTrigger, merged, state_name
from projections.ports import ViewStore

MONITOR_STATE = "capacity.monitor"


def platform_window(params: Parameters, store: ViewStore, partitions: int) -> CapacityProjection:
    """The merged window of every partition, with the monitor's firing flags: what /metrics
    and `analyze capacity` show on the distributed runtime."""
    *states, memo = store.capacity_states([*map(state_name, range(partitions)), MONITOR_STATE])
    window = merged(params, [s or {} for s in states])
    window.firing = dict((memo or {}).get("firing", {}))
    return window


class CapacityMonitor:
    def __init__(self, params: Parameters, store: ViewStore, partitions: int) -> None:
        self.params = params
        self.store = store
        self.partitions = partitions
        self.evaluations = 0
        self.fenced = 0  # evaluations dropped: the memo changed under them

    def evaluate(self) -> list[ReviewTrigger]:
        """Merge the partitions' windows, compare with the limits, save what changed; the
        triggers that crossed since the last evaluation (the caller opens their reviews)."""
        self.evaluations += 1
        *states, stored = self.store.capacity_states([*map(state_name, range(self.partitions)), MONITOR_STATE])
        window = merged(self.params, [s or {} for s in states])
        memo = stored or {}
        firing: dict[str, bool] = dict(memo.get("firing", {}))
        episodes: dict[str, int] = {k: int(v) for k, v in memo.get("episodes", {}).items()}
        out: list[ReviewTrigger] = []
        for trigger, value, limit, (tenant, bucket) in window.crossings():
            over = value > limit
            if over and not firing.get(trigger):
                episodes[trigger] = episodes.get(trigger, 0) + 1
                details: dict[str, Any] = {
                    "rate": round(value, 1),
                    "limit": limit,
                    "window_s": self.params.capacity_window,
                    "at": window.last_at,
                    "partitions": self.partitions,
                }
                key = f"{trigger}/merged/{episodes[trigger]}"
                out.append(ReviewTrigger(trigger, tenant, bucket, details, review_key=key))
            firing[trigger] = over
        body = {"firing": firing, "episodes": episodes}
        changed = body != {"firing": memo.get("firing", {}), "episodes": memo.get("episodes", {})}
        if changed and not self.store.compare_and_put_capacity(MONITOR_STATE, stored, body):
            # Another monitor (this one's partition moved while it was paused) changed the memo
            # since it was read: this evaluation is stale, its triggers are dropped and the next
            # evaluation starts from what the other one saved.
            self.fenced += 1
            return []
        return out
