"""The dicts the command side answers with for reviews and tiers (the HTTP API and the
reviewer console show them as they are; docs/PROTOCOL.md, the OpenAPI description). They
live in the service layer because commands return them (`decide_review` answers with the
review as decided), and the API reads them back in the same shape (`api/reads.py`)."""

from __future__ import annotations

from typing import Any

from domain.review import Review
from domain.tier import Tier


def review_dict(r: Review) -> dict[str, Any]:
    return {
        "review_id": str(r.id),
        "tenant": r.tenant,
        "size_bucket": r.size_bucket,
        "trigger": r.trigger,
        "details": r.details,
        "opened_by": r.opened_by,
        "opened_at": r.opened_at,
        "status": r.status,
        "decision": r.decision,
        "decision_params": r.decision_params,
        "decided_by": r.decided_by,
        "decided_at": r.decided_at,
    }


def tier_dict(tenant: str, size_bucket: str, tier: Tier | None) -> dict[str, Any]:
    if tier is None:
        return {"tenant": tenant, "size_bucket": size_bucket, "state": "disabled", "conversations": []}
    return {
        "tenant": tenant,
        "size_bucket": size_bucket,
        "state": "enabled" if tier.enabled else "disabled",
        "review_id": tier.review_id,
        "read_diffusion_min_saving": tier.min_saving if tier.enabled else None,
        "read_diffusion_max_active_ratio": tier.max_active_ratio if tier.enabled else None,
        "changed_at": tier.changed_at,
        "conversations": sorted(tier.conversations),
    }
