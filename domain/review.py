"""Review (ADR decision 3): the only way to enable the mention_only tier of a scope
(tenant x size bucket). T1/T2 only open one; a person decides it."""

from __future__ import annotations

import math
from typing import Any
from uuid import UUID, uuid4, uuid5

from eventsourcing.domain import Aggregate, event
from eventsourcing.utils import get_topic, register_topic

from domain.errors import Conflict, InvalidArgument
from domain.identity import check_tenant
from domain.params import SizeBucket

_NS = UUID("c3a1f0e2-7b9d-4e11-a2c4-5d6e7f809a1b")

TRIGGERS = ("manual", "T1", "T2")
# Opened by the re-review watch (domain/rereview.py, ADR-0026), never by a caller of the API.
WATCH_TRIGGERS = ("rereview_1", "rereview_4", "rereview_7")
DECISIONS = ("enable_mention_only", "scale_out", "rate_limit", "no_action")


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def check_alpha_parameters(min_saving: Any, max_active_ratio: Any) -> None:
    """The two parameters of enable_mention_only (a decision, or its preview)."""
    # Finite too: an Infinity would be stored in the log and make every JSON of it invalid.
    if not (_finite(min_saving) and min_saving > 0):
        raise InvalidArgument("read_diffusion_min_saving must be a finite number > 0", field="read_diffusion_min_saving")
    if not (_finite(max_active_ratio) and 0 < max_active_ratio <= 1):
        raise InvalidArgument(
            "read_diffusion_max_active_ratio must be a finite number in (0, 1]",
            field="read_diffusion_max_active_ratio",
        )


class Review(Aggregate):
    class Opened(Aggregate.Created):
        tenant: str
        size_bucket: str
        trigger: str
        details: dict[str, Any]
        opened_by: str
        at: float
        review_key: str | None

    class Decided(Aggregate.Event):
        decision: str
        params: dict[str, float]
        by: str
        note: str
        at: float

    @staticmethod
    def create_id(*_: Any, tenant: str | None = None, review_key: str | None = None, **__: Any) -> UUID:
        """Metric-opened reviews have a deterministic key, so a replayed trigger
        cannot open the same review twice. A new review's tenant must be valid (ADR-0008)."""
        if tenant is not None:
            check_tenant(tenant)
        return uuid5(_NS, f"review/{review_key}") if review_key else uuid4()

    @event(Opened)
    def __init__(
        self,
        tenant: str,
        size_bucket: str,
        trigger: str,
        details: dict[str, Any],
        opened_by: str,
        at: float,
        review_key: str | None = None,
    ) -> None:
        if trigger not in TRIGGERS and trigger not in WATCH_TRIGGERS:
            raise InvalidArgument(f"trigger must be one of {TRIGGERS}", field="trigger")
        SizeBucket(size_bucket)
        self.tenant = tenant
        self.size_bucket = size_bucket
        self.trigger = trigger
        self.details = details
        self.opened_by = opened_by
        self.opened_at = at
        self.status = "open"
        self.decision: str | None = None
        self.decision_params: dict[str, float] = {}
        self.decided_by: str | None = None
        self.decided_at: float | None = None

    def decide(
        self,
        decision: str,
        by: str,
        now: float,
        read_diffusion_min_saving: float | None = None,
        read_diffusion_max_active_ratio: float | None = None,
        note: str = "",
    ) -> None:
        if self.status != "open":
            raise Conflict(f"review {self.id} is already decided ({self.decision})", review_id=str(self.id))
        if decision not in DECISIONS:
            raise InvalidArgument(f"decision must be one of {DECISIONS}", field="decision")
        params: dict[str, float] = {}
        if decision == "enable_mention_only":
            if read_diffusion_min_saving is None or read_diffusion_max_active_ratio is None:
                raise InvalidArgument(
                    "enable_mention_only needs read_diffusion_min_saving and read_diffusion_max_active_ratio",
                    field="decision",
                )
            check_alpha_parameters(read_diffusion_min_saving, read_diffusion_max_active_ratio)
            params = {
                "read_diffusion_min_saving": float(read_diffusion_min_saving),
                "read_diffusion_max_active_ratio": float(read_diffusion_max_active_ratio),
            }
        self._decided(decision=decision, params=params, by=by, note=note, at=now)

    @event(Decided)
    def _decided(self, decision: str, params: dict[str, float], by: str, note: str, at: float) -> None:
        self.status = "decided"
        self.decision = decision
        self.decision_params = params
        self.decided_by = by
        self.decided_at = at


# Review was declared in domain/tier.py until 2026-12: logs written before name its
# events "domain.tier:Review.*". Those resolve to this class, and a topic filter over
# the log must name both spellings (topics_of).
LEGACY_TOPIC = "domain.tier:Review"
register_topic(LEGACY_TOPIC, Review)


def topics_of(*classes: type) -> list[str]:
    """The stored topics of these event classes, including those written under an old name."""
    out = []
    for cls in classes:
        topic = get_topic(cls)
        out.append(topic)
        if topic.startswith(get_topic(Review) + "."):
            out.append(LEGACY_TOPIC + topic[len(get_topic(Review)) :])
    return out
