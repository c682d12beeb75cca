"""`folded_topics()` is what the relay publishes (ADR-0034) and what the host folds: it must
name every event some projection of `build_projections` folds (a topic missing here would never
reach the workers: their views would silently lack it), under its old stored names too, and
leave out the events no projection folds (the tenant quota's)."""

from __future__ import annotations

from eventsourcing.utils import get_topic

from adapters.memory import MemoryViews
from domain.conversation import Conversation
from domain.params import Parameters
from domain.quota import TenantQuota
from domain.review import Review, topics_of
from projections.hosting import PROJECTION_TYPES, PROJECTIONS, build_projections, folded_topics, topics


def test_the_relayed_topics_are_every_projections_own() -> None:
    built = build_projections(MemoryViews(), Parameters())
    assert tuple(type(p) for p in built) == PROJECTION_TYPES
    assert tuple(p.name for p in built) == PROJECTIONS
    assert folded_topics() == frozenset(topics_of(*topics(built))) == folded_topics(built)


def test_old_review_topics_are_relayed_and_quota_events_are_not() -> None:
    relayed = folded_topics()
    assert get_topic(Conversation.MessageSent) in relayed
    assert "domain.tier:Review.Opened" in relayed and get_topic(Review.Opened) in relayed
    quota = [
        get_topic(c) for c in vars(TenantQuota).values() if isinstance(c, type) and issubclass(c, TenantQuota.Event)
    ]
    assert quota and not relayed.intersection(quota)
