"""The commands on reviews and the tiers they enable (ADR-0003, ADR-0007): open a review,
decide it (enabling `mention_only` for a size bucket of a tenant), roll a tier back, and the
lookups of a scope's tier the sends make (`_tier`). `FanoutApplication` (fanout/application.py)
is built on these and says what a tier change does to one conversation
(`_evaluate_conversation`, `_return_to_always`).

Most scopes never get a tier: that is remembered instead of a store query per send. One
writer (the embedded runtime) remembers it for good (only it can create one). On a shared
store another replica may create it: the absence is remembered for `NO_TIER_TTL` seconds and
trusted only when the caller says a stale absence is harmless (ADR-0023)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from domain.errors import InvalidArgument, NotFound
from domain.params import Parameters, SizeBucket
from domain.policy import DISABLED, TierTerms
from domain.review import Review
from domain.tier import Tier
from fanout.command_unit import CommandUnit, retried
from fanout.units import Unit
from fanout.wire import review_dict, tier_dict

# How long a replica on a shared store trusts that a scope has no tier (ADR-0023).
NO_TIER_TTL = 1.0


class TierCommands(CommandUnit):
    def __init__(
        self,
        env: dict[str, str] | None,
        *,
        shared_store: bool,
        params: Parameters,
        clock: Callable[[], float],
        conversations_in_scope: Callable[[str, str], list[str]] | None,
    ) -> None:
        super().__init__(env, shared_store=shared_store)
        self.params = params
        self.clock = clock
        self.conversations_in_scope = conversations_in_scope or (lambda tenant, bucket: [])
        # (tenant, size bucket) -> until when (monotonic) it is known to have no tier
        self._no_tier: dict[tuple[str, str], float] = {}

    # -- what a tier change does to one conversation (the application's) ------------------------

    def _evaluate_conversation(self, tenant: str, conversation_id: str) -> tuple[str, int | None]:
        """Re-run the conversation's write-policy state machine now, in its own unit: its
        policy, and the position of what that recorded (None: nothing)."""
        raise NotImplementedError

    def _return_to_always(self, tenant: str, conversation_id: str, now: float, touched: Unit) -> None:
        """The conversation leaves its rolled-back tier for `always`, in the rollback's unit."""
        raise NotImplementedError

    # -- lookups -----------------------------------------------------------------------------------

    def _tier(self, tenant: str, size_bucket: str, *, absent_may_be_stale: bool = False) -> Tier | None:
        """The scope's tier, or None (see the module doc for when an absence is remembered)."""
        key = (tenant, size_bucket)
        until = self._no_tier.get(key)
        if until is not None and (not self.shared_store or (absent_may_be_stale and time.monotonic() < until)):
            return None
        tier = self._find(
            Tier, Tier.create_id(tenant, size_bucket), tenant, f"tier {size_bucket}", size_bucket=size_bucket
        )
        if tier is not None and tier.size_bucket != size_bucket:
            raise NotFound(f"tier {size_bucket} not found", size_bucket=size_bucket)
        if tier is None:
            self._no_tier[key] = time.monotonic() + NO_TIER_TTL if self.shared_store else float("inf")
        else:
            self._no_tier.pop(key, None)
        return tier

    def _review(self, tenant: str, review_id: str, *, saves: bool = False) -> Review:
        try:
            rid = UUID(review_id)
        except (ValueError, TypeError, AttributeError):
            raise NotFound(f"review {review_id} not found", review_id=review_id) from None
        review = self._find(Review, rid, tenant, f"review {review_id}", saves=saves, review_id=review_id)
        if review is None:
            raise NotFound(f"review {review_id} not found", review_id=review_id)
        return review

    def review(self, tenant: str, review_id: str) -> Review:
        with self.lock:
            return self._review(tenant, review_id)

    def tiers(self, tenant: str) -> list[dict[str, Any]]:
        with self.lock:
            return [tier_dict(tenant, b.value, self._tier(tenant, b.value)) for b in SizeBucket]

    def tier_terms(self, tenant: str, size_bucket: str) -> TierTerms:
        with self.lock:
            tier = self._tier(tenant, size_bucket)
            return tier.terms() if tier is not None else DISABLED

    # -- commands ----------------------------------------------------------------------------------

    @retried
    def open_review(
        self,
        tenant: str,
        size_bucket: str,
        trigger: str,
        details: dict[str, Any],
        opened_by: str,
        review_key: str | None = None,
    ) -> dict[str, Any]:
        _bucket(size_bucket)
        with self._unit() as touched:
            if review_key is not None:
                existing = self._find(Review, Review.create_id(review_key=review_key), tenant, "review")
                if existing is not None:
                    return self._positioned(review_dict(existing), touched)
            review = Review(
                tenant=tenant,
                size_bucket=size_bucket,
                trigger=trigger,
                details=details,
                opened_by=opened_by,
                at=self.clock(),
                review_key=review_key,
            )
            touched.append(review)
            result = review_dict(review)
        return self._positioned(result, touched)

    @retried
    def decide_review(
        self,
        tenant: str,
        review_id: str,
        decision: str,
        decided_by: str,
        read_diffusion_min_saving: float | None = None,
        read_diffusion_max_active_ratio: float | None = None,
        note: str = "",
    ) -> dict[str, Any]:
        with self._unit() as touched:
            review = self._review(tenant, review_id, saves=True)
            now = self.clock()
            review.decide(
                decision,
                decided_by,
                now,
                read_diffusion_min_saving=read_diffusion_min_saving,
                read_diffusion_max_active_ratio=read_diffusion_max_active_ratio,
                note=note,
            )
            touched.append(review)
            if decision == "enable_mention_only":
                tier = self._tier(tenant, review.size_bucket) or Tier(tenant=tenant, size_bucket=review.size_bucket)
                self._no_tier.pop((tenant, review.size_bucket), None)
                tier.enable(review, now)
                touched.append(tier)
            result = review_dict(review)
        position = touched.position
        if decision == "enable_mention_only":
            # A tier change is an evaluation point for the conversations of its scope.
            for cid in self.conversations_in_scope(tenant, review.size_bucket):
                switched_at = self._evaluate_conversation(tenant, cid)[1]
                if switched_at is not None:
                    position = switched_at
        result["position"] = position if position is not None else self.log_position()
        return result

    @retried
    def roll_back_tier(self, tenant: str, size_bucket: str, by: str, reason: str) -> dict[str, Any]:
        """The safety valve: every conversation of the scope returns to always at once."""
        _bucket(size_bucket)
        with self._unit() as touched:
            tier = self._tier(tenant, size_bucket)
            if tier is None:
                raise NotFound(f"tier {size_bucket} of tenant {tenant} was never enabled", size_bucket=size_bucket)
            now = self.clock()
            cids = tier.roll_back(by, reason, now)
            touched.append(tier)
            for cid in cids:
                self._return_to_always(tenant, cid, now, touched)
                tier.conversation_exited(conversation_id=cid)  # the roster empties either way
            result = {**tier_dict(tenant, size_bucket, tier), "returned_to_always": cids}
        return self._positioned(result, touched)


def _bucket(size_bucket: str) -> SizeBucket:
    try:
        return SizeBucket(size_bucket)
    except ValueError:
        raise InvalidArgument(
            f"size_bucket must be one of {[b.value for b in SizeBucket]}", field="size_bucket"
        ) from None
