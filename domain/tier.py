"""Tier (scope = tenant x size bucket; ADR decision 3), enabled only by a Review.

The mention_only tier is enabled only by an approved review; T1/T2 only open one."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

from domain.errors import Conflict, ReviewRequired
from domain.identity import scoped_name
from domain.policy import TierTerms
from domain.review import Review

_NS = UUID("c3a1f0e2-7b9d-4e11-a2c4-5d6e7f809a1b")  # shared with domain.review: ids must not change


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
