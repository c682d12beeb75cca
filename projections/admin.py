"""The admin views: reviews and tiers as the API and `analyze` show them. Every write
is an upsert keyed by the review or tier id, so a replayed event changes nothing."""

from __future__ import annotations

from functools import singledispatchmethod
from typing import Any

from domain.review import Review
from domain.tier import Tier
from projections.ports import ViewStore, ViewWriter


class AdminProjection:
    name = "admin"
    topics = (Review.Opened, Review.Decided, Tier.Enabled, Tier.RolledBack)

    def __init__(self, store: ViewStore) -> None:
        self.store = store
        self.reviews: dict[str, dict[str, Any]] = {}

    def process(self, event: Any, position: int, w: ViewWriter) -> list[Any]:
        self._process(event, position, w)
        return []

    def flush(self, w: ViewWriter) -> None:
        pass

    def missing(self, event: Any) -> bool:
        return isinstance(event, Review.Decided) and str(event.originator_id) not in self.reviews

    def load(self, event: Any) -> None:
        self.reviews[str(event.originator_id)] = dict(self.store.review(str(event.originator_id)))

    def forget(self, conversation_ids: set[Any] | None = None) -> None:
        self.reviews.clear()

    @singledispatchmethod
    def _process(self, event: Any, position: int, w: ViewWriter) -> None:
        return None

    @_process.register
    def _review_opened(self, e: Review.Opened, position: int, w: ViewWriter) -> None:
        review = {
            "review_id": str(e.originator_id),
            "tenant": e.tenant,
            "size_bucket": e.size_bucket,
            "trigger": e.trigger,
            "details": e.details,
            "opened_by": e.opened_by,
            "opened_at": e.at,
            "status": "open",
            "decision": None,
            "decision_params": {},
            "decided_by": None,
            "decided_at": None,
        }
        self.reviews[str(e.originator_id)] = review
        w.put_review(review)

    @_process.register
    def _review_decided(self, e: Review.Decided, position: int, w: ViewWriter) -> None:
        if self.missing(e):
            self.load(e)
        review = self.reviews[str(e.originator_id)]
        review.update(status="decided", decision=e.decision, decision_params=e.params, decided_by=e.by, decided_at=e.at)
        w.put_review(review)

    @_process.register
    def _tier_enabled(self, e: Tier.Enabled, position: int, w: ViewWriter) -> None:
        w.put_tier(
            {
                "tier_id": str(e.originator_id),
                "enabled": True,
                "review_id": e.review_id,
                "read_diffusion_min_saving": e.min_saving,
                "read_diffusion_max_active_ratio": e.max_active_ratio,
                "changed_at": e.at,
            }
        )

    @_process.register
    def _tier_rolled_back(self, e: Tier.RolledBack, position: int, w: ViewWriter) -> None:
        w.put_tier({"tier_id": str(e.originator_id), "enabled": False, "changed_at": e.at})
