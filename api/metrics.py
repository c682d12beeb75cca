"""Prometheus metrics of one API app (SPEC section 6, `GET /metrics`).

Each app has its own CollectorRegistry, so several apps (tests) never share series.
Gauges that describe the runtime are read at scrape time; alpha is costly (one
query per conversation), so it is refreshed at most every `alpha_refresh` seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from domain.errors import FanoutError
from fanout.rereview import ReReviewWatch
from fanout.runtime import Runtime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ADMISSION_GATES = (
    ("RATE_LIMITED", "per_conversation_msg_rate"),
    ("RATE_LIMITED", "per_sender_in_conversation_rate"),
    ("FANOUT_QUOTA_EXCEEDED", "tenant_fanout_quota"),
    ("RATE_LIMITED", "per_user_command_rate"),
)


def capacity_rates(runtime: Runtime) -> dict[str, float]:
    """runtime.capacity().rates(): running sums, safe to read from another thread."""
    return dict(runtime.capacity().rates())


HOST_COUNTERS = (
    ("units", "fanout_host_units", "Units of work a projection host committed"),
    ("failures", "fanout_host_failed_units", "Units of work that failed and were retried"),
    (
        "fenced",
        "fanout_host_fenced_units",
        "Units (and T1/T2 evaluations) stopped because another writer had moved their partition past them "
        "(a paused worker that lost its partition: ADR-0021)",
    ),
    ("heals", "fanout_host_heals", "Times a host found the views behind what it had committed (lost writes)"),
    ("reread", "fanout_host_reread_records", "Records read again from the log to fill a gap in the views"),
)


def host_counters(counters: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """Each projection host's totals (the workers' heartbeats), one series per worker."""
    for key, name, doc in HOST_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["worker"])
        for worker, values in sorted(counters.items()):
            family.add_metric([worker], float(values.get(key, 0)))
        yield family


class Metrics:
    def __init__(
        self, runtime: Runtime, *, alpha_refresh: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.runtime = runtime
        self.watch: ReReviewWatch | None = None  # set by create_app: the re-review conditions' series
        self.registry = CollectorRegistry()
        self.rejections = Counter(
            "fanout_admission_rejections",
            "Sends rejected by an admission gate (explicit RATE_LIMITED / FANOUT_QUOTA_EXCEEDED)",
            ["reason", "gate"],
            registry=self.registry,
        )
        for reason, gate in ADMISSION_GATES:  # present at 0 from the start, so rate() works
            self.rejections.labels(reason=reason, gate=gate)
        self.send_seconds = Histogram(
            "fanout_send_seconds",
            "Time to admit and sequence one message (the command, not its fan-out)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.registry.register(_RuntimeCollector(self, alpha_refresh, clock))

    def rejected(self, error: FanoutError) -> None:
        self.rejections.labels(reason=error.code, gate=str(error.details.get("gate", "unknown"))).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RuntimeCollector:
    def __init__(self, metrics: Metrics, alpha_refresh: float, clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.runtime = metrics.runtime
        self.alpha_refresh = alpha_refresh
        self.clock = clock
        self._alpha: dict[str, dict[str, Any]] = {}
        self._alpha_at: float | None = None
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # collected lazily at scrape time

    def alpha(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            now = self.clock()
            if self._alpha_at is None or now - self._alpha_at >= self.alpha_refresh:
                self._alpha = self.runtime.queries.alpha_by_bucket(None)
                self._alpha_at = now
            return self._alpha

    def collect(self) -> Iterator[Metric]:
        rt = self.runtime
        rates = capacity_rates(rt)
        yield GaugeMetricFamily(
            "fanout_entries_per_sec",
            "Mailbox entries written per second over the capacity window (T1 input)",
            value=rates["fanout_entries_per_sec"],
        )
        yield GaugeMetricFamily(
            "fanout_large_group_entries_per_sec",
            "Mailbox entries of large groups per second over the capacity window (T2 input)",
            value=rates["large_group_entries_per_sec"],
        )
        ratio = GaugeMetricFamily(
            "conversation_active_member_ratio",
            "alpha: active members / members, mean over the conversations of a size bucket",
            labels=["size_bucket"],
        )
        for bucket, summary in self.alpha().items():
            if summary["alpha_mean"] is not None:
                ratio.add_metric([bucket], summary["alpha_mean"])
        yield ratio
        log_position = rt.log_position()
        yield GaugeMetricFamily(
            "fanout_projection_lag",
            "Events in the log not yet projected into the views",
            value=max(0, log_position - rt.position()),
        )
        guard = rt.clock_guard
        if guard is not None:  # an API replica of the distributed runtime (ADR-0041)
            skew = GaugeMetricFamily(
                "fanout_clock_skew_seconds",
                "This replica's clock minus the event store's at the last health check (writes refused "
                "UNAVAILABLE clock_skew beyond FANOUT_MAX_CLOCK_SKEW); absent until measured",
            )
            if guard.skew is not None:
                skew.add_metric([], guard.skew)
            yield skew
            yield CounterMetricFamily(
                "fanout_clock_skew_refusals",
                "Writes this replica refused for its clock (ADR-0041)",
                value=guard.refusals,
            )
        yield CounterMetricFamily(
            "fanout_review_triggers",
            "Reviews opened by T1/T2 (they only open a review; a person decides)",
            value=rt.review_triggers,
        )
        yield CounterMetricFamily(
            "fanout_online_pushes", "Frames pushed to online devices (O(O) socket writes)", value=rt.hub.pushes_total
        )
        yield GaugeMetricFamily("fanout_online_connections", "Open WebSocket sessions", value=rt.hub.online_count())
        app = rt.app
        for name, doc, value in (
            ("fanout_group_commits", "Event-store transactions of grouped commands (ADR-0030)", app.group_commits),
            ("fanout_grouped_commands", "Commands written in those transactions", app.grouped_commands),
            (
                "fanout_group_fallbacks",
                "Groups whose transaction failed (a lost race): their commands ran again one by one",
                app.group_fallbacks,
            ),
            (
                "fanout_write_conflicts",
                "Saves that lost an optimistic-concurrency race and were retried",
                app.conflicts,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        if rt.head_cache is not None:
            stats = rt.head_cache.stats
            heads = CounterMetricFamily(
                "fanout_head_cache_heads",
                "Conversation heads the logins asked this replica for: served from its head cache, or read (ADR-0035)",
                labels=["source"],
            )
            heads.add_metric(["cache"], stats.hits)
            heads.add_metric(["views"], stats.misses)
            yield heads
            yield CounterMetricFamily(
                "fanout_head_cache_resets",
                "Times the head cache dropped everything: a worker's commit record was lost or overlapped",
                value=stats.resets,
            )
            yield GaugeMetricFamily("fanout_head_cache_size", "Heads kept in the head cache", value=len(rt.head_cache))
        yield from host_counters(rt.host_counters())
        yield from rereview_series(self.metrics.watch, rt)


def rereview_series(watch: ReReviewWatch | None, rt: Runtime) -> Iterator[Metric]:
    """ADR-0003's watched re-review conditions as the last evaluation saw them (ADR-0026)."""
    seconds, entries = rt.mailbox_cost()
    estimate = rt.params.mailbox_unit_cost_estimate_us
    cost = GaugeMetricFamily(
        "fanout_mailbox_unit_cost_us",
        "The mailbox layer's unit cost: microseconds of the mailbox store's write per entry over the fan-out writes "
        "of at least 1,000 entries, since start (re-review condition 4; the embedded runtime's own, the workers' "
        "on the distributed one)",
    )
    if seconds is not None and entries:
        cost.add_metric([], seconds * 1e6 / entries)
    yield cost
    yield GaugeMetricFamily(
        "fanout_mailbox_unit_cost_estimate_us",
        "The initial estimate of that unit cost (FANOUT_MAILBOX_UNIT_COST_ESTIMATE_US); condition 4 is red above 3x",
        value=estimate,
    )
    yield CounterMetricFamily(
        "fanout_mailbox_entries_timed", "Mailbox entries whose write time the unit cost covers", value=entries
    )
    red = GaugeMetricFamily(
        "fanout_rereview_condition_red",
        "ADR-0003 re-review condition (1, 4, 7): 1 red, 0 green, absent while unknown (no data)",
        labels=["condition"],
    )
    value = GaugeMetricFamily(
        "fanout_rereview_condition_value",
        "What the condition measures: (1) seconds T1/T2 have held, (4) unit cost in us, (7) large-bucket mean alpha",
        labels=["condition"],
    )
    last = watch.last if watch is not None else None
    for c in (last or {}).get("conditions", []):
        if c["state"] != "unknown":
            red.add_metric([str(c["condition"])], 1.0 if c["state"] == "red" else 0.0)
        if c["value"] is not None:
            value.add_metric([str(c["condition"])], float(c["value"]))
    yield red
    yield value
    yield CounterMetricFamily(
        "fanout_rereview_reviews",
        "Reviews this process opened because a re-review condition turned red (one per episode)",
        value=watch.opened if watch is not None else 0,
    )
