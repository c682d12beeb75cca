"""Capacity metrics and T1/T2 detection (ADR decision 3).

Event-time windows over MessageSent.fanout_entries. Crossing T1 or T2 yields a
`ReviewTrigger` effect; the runtime turns it into an opened Review. Nothing here
enables a tier or switches a conversation."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from domain.params import Parameters, SizeBucket


@dataclass(frozen=True)
class ReviewTrigger:
    trigger: str  # "T1" | "T2"
    tenant: str
    size_bucket: str
    details: dict[str, Any]
    review_key: str


class CapacityProjection:
    name = "capacity"

    def __init__(self, params: Parameters, state: dict[str, Any] | None = None) -> None:
        self.params = params
        # (at, tenant, size_bucket, entries) within the window
        self.window: deque[tuple[float, str, str, int]] = deque(tuple(x) for x in (state or {}).get("window", []))
        self.first_at: float | None = (state or {}).get("first_at")
        self.firing: dict[str, bool] = dict((state or {}).get("firing", {}))
        self.entries_total = int((state or {}).get("entries_total", 0))
        self.messages_total = int((state or {}).get("messages_total", 0))

    def state(self) -> dict[str, Any]:
        return {
            "window": list(self.window),
            "first_at": self.first_at,
            "firing": self.firing,
            "entries_total": self.entries_total,
            "messages_total": self.messages_total,
        }

    def observe(self, at: float, tenant: str, bucket: str, entries: int, position: int) -> list[ReviewTrigger]:
        w = self.params.capacity_window
        if self.first_at is None:
            self.first_at = at
        self.window.append((at, tenant, bucket, entries))
        self.entries_total += entries
        self.messages_total += 1
        while self.window and self.window[0][0] < at - w:
            self.window.popleft()
        if at - self.first_at < w:
            return []  # not yet a whole window: nothing is "sustained"
        out = []
        for trigger, value, limit, scope in self._checks():
            over = value > limit
            if over and not self.firing.get(trigger):
                tenant_, bucket_ = scope
                out.append(
                    ReviewTrigger(
                        trigger,
                        tenant_,
                        bucket_,
                        {"rate": round(value, 1), "limit": limit, "window_s": w, "at": at},
                        review_key=f"{trigger}/{tenant_}/{bucket_}/{position}",
                    )
                )
            self.firing[trigger] = over
        return out

    def rates(self) -> dict[str, float]:
        w = self.params.capacity_window
        window = tuple(self.window)  # one C-level copy: safe against the projector thread appending
        total = sum(x[3] for x in window)
        large = sum(x[3] for x in window if x[2] == SizeBucket.LARGE.value)
        return {"fanout_entries_per_sec": total / w, "large_group_entries_per_sec": large / w}

    def _checks(self) -> list[tuple[str, float, float, tuple[str, str]]]:
        p = self.params
        r = self.rates()
        return [
            ("T1", r["fanout_entries_per_sec"], p.t1_ratio * p.platform_fanout_budget, self._dominant(None)),
            ("T2", r["large_group_entries_per_sec"], p.t2_ratio * p.mailbox_write_budget, self._dominant("large")),
        ]

    def _dominant(self, bucket: str | None) -> tuple[str, str]:
        """The review's scope: the tenant x size bucket with the largest share of the window."""
        share: dict[tuple[str, str], int] = {}
        for _, tenant, b, n in tuple(self.window):
            if bucket is None or b == bucket:
                share[(tenant, b)] = share.get((tenant, b), 0) + n
        if not share:
            return ("-", bucket or "large")
        return max(share.items(), key=lambda kv: kv[1])[0]
