"""Tier (scope = tenant x size bucket) and Review (ADR decision 3).

The mention_only tier is enabled only by an approved review; T1/T2 only open one."""

from __future__ import annotations

import math
from typing import Any
from uuid import UUID, uuid4, uuid5

from eventsourcing.domain import Aggregate, event

from domain.errors import Conflict, InvalidArgument, ReviewRequired
from domain.identity import check_tenant, scoped_name
from domain.params import SizeBucket
from domain.policy import TierTerms

_NS = UUID("c3a1f0e2-7b9d-4e11-a2c4-5d6e7f809a1b")

TRIGGERS = ("manual", "T1", "T2")
DECISIONS = ("enable_mention_only", "scale_out", "rate_limit", "no_action")


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


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
        if trigger not in TRIGGERS:
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
            # Finite too: an Infinity would be stored in the log and make every JSON of it invalid.
            if not (_finite(read_diffusion_min_saving) and read_diffusion_min_saving > 0):
                raise InvalidArgument(
                    "read_diffusion_min_saving must be a finite number > 0", field="read_diffusion_min_saving"
                )
            if not (_finite(read_diffusion_max_active_ratio) and 0 < read_diffusion_max_active_ratio <= 1):
                raise InvalidArgument(
                    "read_diffusion_max_active_ratio must be a finite number in (0, 1]",
                    field="read_diffusion_max_active_ratio",
                )
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


class Tier(Aggregate):
    class Created(Aggregate.Created):
        tenant: str
        size_bucket: str

    class Enabled(Aggregate.Event):
        review_id: str
        min_saving: float
        max_active_ratio: float
        at: float

    class RolledBack(Aggregate.Event):
        by: str
        reason: str
        at: float

    class ConversationEntered(Aggregate.Event):
        conversation_id: str

    class ConversationExited(Aggregate.Event):
        conversation_id: str

    @staticmethod
    def create_id(tenant: str, size_bucket: str, *_: Any, **__: Any) -> UUID:
        return uuid5(_NS, scoped_name("tier", tenant, size_bucket))  # ADR-0008

    @event(Created)
    def __init__(self, tenant: str, size_bucket: str) -> None:
        self.tenant = tenant
        self.size_bucket = size_bucket
        self.enabled = False
        self.review_id: str | None = None
        self.min_saving = 0.0
        self.max_active_ratio = 0.0
        self.changed_at: float | None = None
        self.conversations: dict[str, bool] = {}  # in mention_only under this tier

    def terms(self) -> TierTerms:
        if not self.enabled:
            return TierTerms(enabled=False)
        return TierTerms(True, self.min_saving, self.max_active_ratio)

    def enable(self, review: Review, now: float) -> None:
        """Only an approved enable_mention_only review for this very scope enables the tier."""
        if review.status != "decided" or review.decision != "enable_mention_only":
            raise ReviewRequired("the mention_only tier needs a review decided enable_mention_only")
        if review.tenant != self.tenant or review.size_bucket != self.size_bucket:
            raise ReviewRequired("the review's scope is another tenant x size bucket")
        self._enabled(
            review_id=str(review.id),
            min_saving=review.decision_params["read_diffusion_min_saving"],
            max_active_ratio=review.decision_params["read_diffusion_max_active_ratio"],
            at=now,
        )

    @event(Enabled)
    def _enabled(self, review_id: str, min_saving: float, max_active_ratio: float, at: float) -> None:
        self.enabled = True
        self.review_id = review_id
        self.min_saving = min_saving
        self.max_active_ratio = max_active_ratio
        self.changed_at = at

    def roll_back(self, by: str, reason: str, now: float) -> list[str]:
        """Disable the tier; returns the conversations that must go back to always at once."""
        if not self.enabled:
            raise Conflict(f"tier {self.tenant}/{self.size_bucket} is not enabled")
        self._rolled_back(by=by, reason=reason, at=now)
        return list(self.conversations)

    @event(RolledBack)
    def _rolled_back(self, by: str, reason: str, at: float) -> None:
        self.enabled = False
        self.changed_at = at

    @event(ConversationEntered)
    def conversation_entered(self, conversation_id: str) -> None:
        self.conversations[conversation_id] = True

    @event(ConversationExited)
    def conversation_exited(self, conversation_id: str) -> None:
        self.conversations.pop(conversation_id, None)
