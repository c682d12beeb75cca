"""What the projection host (`streams/host.py`, in every runtime) needs to know: one
shape for every projection, and the one declared list of them.

A projection is `process(event, position, writer) -> effects`: it folds an event into
the views through the writer (idempotent upserts: a replayed event changes nothing) and
returns plain, serialisable effect records for the host to act on AFTER the unit of
work has committed: `Delivered` (online push, invariant O) and `ReviewTrigger` (open a
review, ADR decision 3); a partitioned host adds `ViewsTracked` (the positions its commit
left in the views, which the API replicas learn from it instead of polling). `flush(writer)` ends each unit of work (state kept in memory
between events is written once per unit, not per event); `forget` drops working sets
when a partition is revoked. A host loops over
`PROJECTIONS` and knows nothing of what each one does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from domain.params import Parameters
from domain.review import topics_of
from projections.admin import AdminProjection
from projections.capacity import CapacityProjection, ReviewTrigger
from projections.delivery import Delivered, DeliveryProjection
from projections.ports import ViewStore, ViewWriter


@dataclass(frozen=True)
class ViewsTracked:
    """After a unit of work committed: log partition -> the position the delivery views of
    that partition now hold (what `ViewReader.position("delivery", partition)` reads); the
    positions they held before it (`since`: a replica sees from the chain whether it missed
    a commit); the heads the unit wrote, (tenant, conversation_id) (a replica's head cache
    drops them, projections/head_cache.py)."""

    positions: Mapping[int, int]
    since: Mapping[int, int] = field(default_factory=dict)
    heads: tuple[tuple[str, str], ...] = ()


Effect = Delivered | ReviewTrigger | ViewsTracked


class Projection(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def topics(self) -> tuple[type, ...]: ...

    def process(self, event: Any, position: int, w: ViewWriter) -> list[Any]: ...

    def flush(self, w: ViewWriter) -> None: ...

    def forget(self, conversation_ids: set[Any] | None = None) -> None:
        """Drop working sets (all, or these conversations'): a revoked partition."""


PROJECTION_TYPES = (DeliveryProjection, CapacityProjection, AdminProjection)  # build_projections' order
PROJECTIONS: tuple[str, ...] = tuple(p.name for p in PROJECTION_TYPES)


def build_projections(
    store: ViewStore, params: Parameters, *, partition: int = 0, triggers: bool = True
) -> tuple[Projection, ...]:  # one of each of PROJECTION_TYPES
    """The projections every host runs, in this order, with their working sets empty
    (they load what they need from the committed views). A host of several log partitions
    builds one set per partition (the capacity window is saved per partition) with
    `triggers=False`: T1/T2 are then evaluated over the merged windows (CapacityMonitor)."""
    return (
        DeliveryProjection(store, params),
        CapacityProjection(params, store, partition=partition, triggers=triggers),
        AdminProjection(store),
    )


def topics(projections: Iterable[Any]) -> tuple[type, ...]:
    """The event classes some of these projections (or projection classes) fold."""
    return tuple(dict.fromkeys(t for p in projections for t in p.topics))


def folded_topics(projections: Iterable[Any] | None = None) -> frozenset[str]:
    """The stored topics (old names included) of the events these projections fold; by
    default every host's (`build_projections`). A host skips any other event; the relay does
    not publish one (ADR-0034)."""
    ps = projections if projections is not None else PROJECTION_TYPES
    return frozenset(topics_of(*topics(ps)))
