"""Capacity metrics and T1/T2 detection (ADR decision 3).

Event-time windows over MessageSent.fanout_entries. Crossing T1 or T2 yields a
`ReviewTrigger` effect; the runtime turns it into an opened Review. Nothing here
enables a tier or switches a conversation."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from domain.conversation import Conversation
from domain.params import Parameters, SizeBucket
from projections.ports import ViewStore, ViewWriter


@dataclass(frozen=True)
class ReviewTrigger:
    trigger: str  # "T1" | "T2"
    tenant: str
    size_bucket: str
    details: dict[str, Any]
    review_key: str


def state_name(partition: int) -> str:
    """The capacity state of one log partition: `capacity` for partition 0 (the embedded
    runtime's only one), `capacity.p<N>` for the others."""
    return CapacityProjection.name if partition == 0 else f"{CapacityProjection.name}.p{partition}"


def merged(params: Parameters, states: list[dict[str, Any]]) -> CapacityProjection:
    """One read-only window over the saved states of several partitions (their slots summed
    per second), for /metrics and `analyze capacity` on the distributed runtime."""
    slots: dict[int, dict[str, int]] = {}
    applied: dict[str, int] = {}
    firing: dict[str, bool] = {}
    firsts, lasts = [], []
    entries = messages = 0
    for st in states:
        for sec, per in st.get("slots", []):
            into = slots.setdefault(int(sec), {})
            for k, n in per.items():
                into[k] = into.get(k, 0) + int(n)
        applied.update(st.get("applied", {}))
        for k, v in st.get("firing", {}).items():
            firing[k] = firing.get(k, False) or bool(v)
        if st.get("first_at") is not None:
            firsts.append(st["first_at"])
        if st.get("last_at") is not None:
            lasts.append(st["last_at"])
        entries += int(st.get("entries_total", 0))
        messages += int(st.get("messages_total", 0))
    last = max(lasts) if lasts else None
    window = params.capacity_window
    body = {
        "applied": applied,
        "slots": [[sec, per] for sec, per in sorted(slots.items()) if last is None or sec > last - window - 1],
        "first_at": min(firsts) if firsts else None,
        "last_at": last,
        "firing": firing,
        "entries_total": entries,
        "messages_total": messages,
    }
    return CapacityProjection(params, state=body)


class CapacityProjection:
    """Fan-out entries per second over an event-time window, kept as one slot per
    second (entries per tenant x size bucket) with running sums, so each message
    costs O(scopes) and the saved state stays small whatever the message rate."""

    name = "capacity"
    topics = (Conversation.Created, Conversation.MessageSent)

    def __init__(
        self,
        params: Parameters,
        store: ViewStore | None = None,
        state: dict[str, Any] | None = None,
        *,
        partition: int = 0,
        triggers: bool = True,
    ) -> None:
        """Hosted: give the store (the state is loaded from it). Read-only (analyze): the state.
        A host of several log partitions runs one per partition: each saves its window under
        its own name (`state_name`), and readers merge them (`merged`). `triggers=False`: the
        window only counts; T1/T2 are evaluated over the merged windows
        (`projections.capacity_monitor`, ADR-0020)."""
        self.store = store
        self.triggers = triggers
        self.state_name = state_name(partition)
        self.params = params
        self.tenants: dict[Any, str] = {}  # conversation aggregate id -> tenant
        self.changed = False
        if state is None and store is not None:
            state = store.capacity_state(self.state_name)
        state = state or {}
        # The last position applied per partition: a replayed MessageSent is not counted twice.
        self.applied: dict[int, int] = {int(k): int(v) for k, v in state.get("applied", {}).items()}
        # (second, {"tenant\x1fbucket": entries}) oldest first
        self.slots: deque[tuple[int, dict[str, int]]] = deque(
            (int(sec), dict(per)) for sec, per in state.get("slots", [])
        )
        self.first_at: float | None = state.get("first_at")
        self.last_at: float | None = state.get("last_at")
        self.firing: dict[str, bool] = dict(state.get("firing", {}))
        self.entries_total = int(state.get("entries_total", 0))
        self.messages_total = int(state.get("messages_total", 0))
        self.per_scope: dict[str, int] = {}
        for _, per in self.slots:
            for k, n in per.items():
                self.per_scope[k] = self.per_scope.get(k, 0) + n

    # -- the projection ------------------------------------------------------------

    def process(self, event: Any, position: int, w: ViewWriter) -> list[ReviewTrigger]:
        if isinstance(event, Conversation.Created):
            # Remembered here: a send in the same unit of work may not find its head committed yet.
            self.tenants[event.originator_id] = event.tenant
            return []
        if not isinstance(event, Conversation.MessageSent) or position <= self.applied.get(w.partition, 0):
            return []
        self.applied[w.partition] = position
        self.changed = True
        if self.missing(event):
            self.load(event)
        tenant = self.tenants[event.originator_id]
        bucket = self.params.size_bucket(event.member_count).value
        return self.observe(event.at, tenant, bucket, event.fanout_entries, position)

    def missing(self, event: Any) -> bool:
        return isinstance(event, Conversation.MessageSent) and event.originator_id not in self.tenants

    def load(self, event: Any) -> None:
        assert self.store is not None, "a hosted capacity projection needs its store"
        self.tenants[event.originator_id] = self.store.conversation_key(event.originator_id)[0]

    def forget(self, conversation_ids: set[Any] | None = None) -> None:
        if conversation_ids is None:
            self.tenants.clear()
        else:
            for aggregate_id in conversation_ids:
                self.tenants.pop(aggregate_id, None)

    def flush(self, w: ViewWriter) -> None:
        """Once per unit of work: the window's state, with the positions it covers."""
        if self.changed:
            w.put_capacity(self.state_name, self.state())
            self.changed = False

    def state(self) -> dict[str, Any]:
        return {
            "applied": {str(k): v for k, v in self.applied.items()},
            "slots": [[sec, per] for sec, per in self.slots],
            "first_at": self.first_at,
            "last_at": self.last_at,
            "firing": self.firing,
            "entries_total": self.entries_total,
            "messages_total": self.messages_total,
        }

    def observe(self, at: float, tenant: str, bucket: str, entries: int, position: int) -> list[ReviewTrigger]:
        w = self.params.capacity_window
        if self.first_at is None:
            self.first_at = at
        self.last_at = at
        sec = math.floor(at)
        if not self.slots or self.slots[-1][0] != sec:
            self.slots.append((sec, {}))
        scope = f"{tenant}\x1f{bucket}"
        per = self.slots[-1][1]
        per[scope] = per.get(scope, 0) + entries
        self.per_scope[scope] = self.per_scope.get(scope, 0) + entries
        self.entries_total += entries
        self.messages_total += 1
        while self.slots and self.slots[0][0] <= at - w - 1:
            for k, n in self.slots.popleft()[1].items():
                left = self.per_scope[k] - n
                if left:
                    self.per_scope[k] = left
                else:
                    del self.per_scope[k]
        if not self.triggers:
            return []
        out = []
        for trigger, value, limit, (tenant_, bucket_) in self.crossings():
            over = value > limit
            if over and not self.firing.get(trigger):
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
        per = dict(self.per_scope)  # one C-level copy: safe against the projector thread
        total = sum(per.values())
        large = sum(n for k, n in per.items() if k.endswith("\x1f" + SizeBucket.LARGE.value))
        return {"fanout_entries_per_sec": total / w, "large_group_entries_per_sec": large / w}

    def limits(self) -> dict[str, float]:
        """T1: 70% of the platform fan-out budget; T2: 50% of the mailbox write budget."""
        p = self.params
        return {"T1": p.t1_ratio * p.platform_fanout_budget, "T2": p.t2_ratio * p.mailbox_write_budget}

    def crossings(self) -> list[tuple[str, float, float, tuple[str, str]]]:
        """(trigger, rate, limit, the dominant (tenant, bucket)) for T1 and T2 at the window's
        end; none before a whole window has been seen (nothing is "sustained" yet)."""
        if self.first_at is None or self.last_at is None or self.last_at - self.first_at < self.params.capacity_window:
            return []
        r, limit = self.rates(), self.limits()
        return [
            ("T1", r["fanout_entries_per_sec"], limit["T1"], self._dominant(None)),
            ("T2", r["large_group_entries_per_sec"], limit["T2"], self._dominant("large")),
        ]

    def _dominant(self, bucket: str | None) -> tuple[str, str]:
        """The review's scope: the tenant x size bucket with the largest share of the window."""
        best: tuple[str, str] | None = None
        most = -1
        for k, n in dict(self.per_scope).items():
            tenant, b = k.split("\x1f", 1)
            if (bucket is None or b == bucket) and n > most:
                best, most = (tenant, b), n
        return best if best is not None else ("-", bucket or "large")
