"""The re-review watch (ADR-0026): ADR-0003's re-review conditions that a metric can see,
evaluated once a second by every API process, shown by the console and /metrics, and an
open review for each episode in which one turns red.

The rule is `domain/rereview.py`; this module gathers its measures from a runtime (the
capacity window's T1/T2 flags, alpha per size bucket from the views, the mailbox layer's
write time) and acts on what it says. Its memo (since when T1/T2 fire, which conditions are
red, the episode count of each) is saved in the views under `rereview.watch` by a
compare-and-set against the memo it read, as the capacity monitor does (ADR-0020): several
API replicas evaluating at once save one memo, and the review of an episode is keyed
`rereview/<condition>/<episode>`, so the event store keeps one review whoever opens it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from domain.errors import FanoutError
from domain.params import Parameters, SizeBucket
from domain.rereview import CHECKLIST, TRIGGER_OF, Measures, Reading, advance, read
from fanout.application import FanoutApplication
from fanout.queries import Queries
from projections.capacity import CapacityProjection
from projections.ports import ViewStore

log = logging.getLogger("fanout.rereview")

WATCH_STATE = "rereview.watch"
INTERVAL = 1.0  # seconds between evaluations
ALPHA_REFRESH = 10.0  # alpha is one view read per large conversation: at most this often


# Condition 4 times the writes of at least this many entries: the O(N) term of a big group's
# fan-out, where a write's fixed cost (a call, a batch per shard: the O(S) term) is amortized.
FANOUT_WRITE = 1_000


class MailboxMeter:
    """Condition 4's measure of the mailbox layer's unit cost: seconds in the mailbox writes
    per entry written, over the writes of at least `FANOUT_WRITE` entries (the O(N) writes).
    A MailboxTimer (projections/ports.py): the composition root gives it to the views it
    builds, which report each write of their units' entries (`observe`)."""

    def __init__(self, *, at_least: int = FANOUT_WRITE) -> None:
        self.at_least = at_least
        self.seconds = 0.0  # in the writes counted
        self.entries = 0  # that they wrote

    def observe(self, seconds: float, entries: int, largest: int) -> None:
        """A write of `entries` entries (`largest` of them one message's) took `seconds`:
        counted when that message is a fan-out of at least `at_least` entries."""
        if largest >= self.at_least:
            self.seconds += seconds
            self.entries += entries


class Watched(Protocol):
    """What the watch reads of a runtime (fanout.runtime.Runtime has all of it)."""

    params: Parameters
    views: ViewStore
    app: FanoutApplication

    def capacity(self) -> CapacityProjection: ...

    def mailbox_cost(self) -> tuple[float | None, int]: ...


class ReReviewWatch:
    def __init__(
        self, runtime: Watched, *, clock: Callable[[], float] = time.time, alpha_refresh: float = ALPHA_REFRESH
    ) -> None:
        self.runtime = runtime
        self.params = runtime.params
        self.clock = clock
        self.alpha_refresh = alpha_refresh
        self._alpha: tuple[float | None, int] = (None, 0)
        self._alpha_at: float | None = None
        self._lock = threading.Lock()
        self.last: dict[str, Any] | None = None  # the last evaluation, as the API shows it
        self.opened = 0  # reviews this process opened
        self.evaluations = 0

    def large_alpha(self, now: float) -> tuple[float | None, int]:
        """(mean alpha, conversations) of the large bucket over every tenant, refreshed at most
        every `alpha_refresh` s (the same summary as /metrics' conversation_active_member_ratio).
        The large bucket's conversations alone are read: the others' members are most of the
        states, and no condition looks at them."""
        if self._alpha_at is None or now - self._alpha_at >= self.alpha_refresh:
            queries = Queries(self.runtime.views, self.params)
            summary = queries.alpha_by_bucket(None, now=now, size_bucket=SizeBucket.LARGE)
            large = summary[SizeBucket.LARGE.value]
            self._alpha = (large["alpha_mean"], int(large["conversations"]))
            self._alpha_at = now
        return self._alpha

    def evaluate(self) -> dict[str, Any]:
        """Read the measures, save the memo, open the review of a condition that turned red;
        the conditions with their data (GET /v1/admin/rereview)."""
        with self._lock:
            self.evaluations += 1
            now = self.clock()
            window = self.runtime.capacity()
            seconds, entries = self.runtime.mailbox_cost()
            alpha_mean, large = self.large_alpha(now)
            measures = Measures(now, holding(window, now), seconds, entries, alpha_mean, large)
            store = self.runtime.views
            stored = store.capacity_state(WATCH_STATE)
            memo = stored or {}
            readings = read(self.params, memo, measures)
            body, turned = advance(memo, readings, now)
            if body != {k: memo.get(k) for k in body} and not store.compare_and_put_capacity(WATCH_STATE, stored, body):
                # Another process saved the memo since it was read: it opened what was due.
                turned = []
            for condition, episode in turned:
                self._open(condition, episode, readings, window)
            self.last = {
                "at": now,
                "conditions": [r.as_dict() for r in readings],
                "checklist": [dict(c) for c in CHECKLIST],
                "episodes": body["episodes"],
            }
            return self.last

    def _open(self, condition: int, episode: int, readings: list[Reading], window: CapacityProjection) -> None:
        reading = next(r for r in readings if r.condition == condition)
        tenant, bucket = scope_of(condition, window)
        if tenant is None:
            log.warning("re-review condition %d is red but no tenant carries the load: no review opened", condition)
            return
        details = {"condition": condition, "episode": episode, **reading.as_dict()}
        try:
            self.runtime.app.open_review(
                tenant,
                bucket,
                TRIGGER_OF[condition],
                details,
                "rereview-watch",
                review_key=f"rereview/{condition}/{episode}",
            )
            self.opened += 1
        except FanoutError as exc:
            log.warning("could not open the review of re-review condition %d: %s", condition, exc)

    def snapshot(self) -> dict[str, Any]:
        """The last evaluation (evaluating now when there is none yet)."""
        return self.last if self.last is not None else self.evaluate()


def holding(window: CapacityProjection, now: float) -> dict[str, bool]:
    """T1 / T2 firing now. The window is in event time: with no send for a whole window its
    flags keep their last value although nothing is written, so a trigger holds only while
    the window's last send is less than a window old (condition 1 counts load, not silence)."""
    live = window.last_at is not None and now - window.last_at <= window.params.capacity_window
    return {t: bool(window.firing.get(t)) and live for t in ("T1", "T2")}


def scope_of(condition: int, window: CapacityProjection) -> tuple[str | None, str]:
    """The tenant x size bucket a re-review is filed under (a review needs one): the window's
    dominant scope, as T1/T2 choose it; the large bucket for condition 7 (its alpha)."""
    best: tuple[str, str] | None = None
    most = -1
    for key, n in dict(window.per_scope).items():
        tenant, bucket = key.split("\x1f", 1)
        if (condition != 7 or bucket == SizeBucket.LARGE.value) and n > most:
            best, most = (tenant, bucket), n
    if best is None:
        return None, SizeBucket.LARGE.value
    return best[0], best[1] if condition != 7 else SizeBucket.LARGE.value
