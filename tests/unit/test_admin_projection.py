"""AdminProjection alone: review and tier events from a real application (POPO event
store) folded into the in-memory views."""

from __future__ import annotations

from domain.params import Parameters
from domain.tier import Tier
from projections.admin import AdminProjection
from tests.unit.projection_log import ProjectionLog

T = "acme"


def test_reviews_and_tiers_as_the_api_shows_them() -> None:
    log = ProjectionLog(Parameters())
    p = AdminProjection(log.views)
    first = log.app.open_review(T, "large", "T2", {"rate": 9.0}, "capacity-monitor")
    second = log.app.open_review(T, "small", "manual", {}, "ops")
    assert log.apply(p) == []
    assert [(r["review_id"], r["status"]) for r in log.views.reviews(T)] == [
        (first["review_id"], "open"),
        (second["review_id"], "open"),
    ]
    log.clock.advance(60)
    log.app.decide_review(T, first["review_id"], "enable_mention_only", "ops", 1000.0, 0.05)
    log.apply(p)
    decided = log.views.review(first["review_id"])
    assert decided["status"] == "decided" and decided["decision"] == "enable_mention_only"
    assert decided["decided_by"] == "ops" and decided["details"] == {"rate": 9.0}
    tier_id = str(Tier.create_id(T, "large"))
    tier = log.views.tier(tier_id)
    assert tier is not None and (tier["enabled"], tier["read_diffusion_min_saving"]) == (True, 1000.0)
    assert log.views.tier(str(Tier.create_id(T, "small"))) is None
    log.app.roll_back_tier(T, "large", "ops", "test")
    log.apply(p)
    tier = log.views.tier(tier_id)
    assert tier is not None and tier["enabled"] is False and tier["review_id"] == first["review_id"]  # merged
    assert log.views.reviews("other") == []


def test_a_decision_whose_review_is_not_in_the_working_set_is_loaded_from_the_views() -> None:
    log = ProjectionLog(Parameters())
    review = log.app.open_review(T, "small", "manual", {}, "ops")
    log.apply(AdminProjection(log.views))
    log.app.decide_review(T, review["review_id"], "no_action", "ops")
    fresh = AdminProjection(log.views)  # a restarted host: nothing in memory
    ((position, decided),) = [(pos, e) for pos, e in log.events() if type(e) in fresh.topics]
    assert fresh.missing(decided)
    log.apply(fresh, [(position, decided)])
    assert log.views.review(review["review_id"])["status"] == "decided"


def test_an_event_applied_twice_changes_nothing() -> None:
    log = ProjectionLog(Parameters())
    log.app.open_review(T, "small", "manual", {}, "ops")
    events = log.events()
    log.apply(AdminProjection(log.views), events)
    before = log.views.reviews(T)
    log.apply(AdminProjection(log.views), events)
    assert log.views.reviews(T) == before
