"""The `test_context()` of the projection unit tests (faust's spirit): a real
FanoutApplication on eventsourcing's POPO (in-memory) event store makes the events,
and a projection is driven with them directly, writing through the in-memory views.
No SQLite, no disk, no runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters.memory import MemoryViews
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.clock import FakeClock
from projections.hosting import Projection


class ProjectionLog:
    """Commands on the left, events on the right: `events()` gives the domain events
    written since the last call, with their log positions."""

    def __init__(self, params: Parameters, clock: FakeClock | None = None) -> None:
        self.params = params
        self.clock = clock or FakeClock()
        self.views = MemoryViews()
        self.app = FanoutApplication(
            params,
            {"PERSISTENCE_MODULE": "eventsourcing.popo"},
            clock=self.clock,
            message_sender=self._sender,
            conversations_in_scope=lambda tenant, bucket: self.views.heads_by_scope(tenant, bucket),
        )
        self.read = 0

    def _sender(self, tenant: str, conversation_id: str, seq: int) -> str | None:
        m = self.views.message(tenant, conversation_id, seq)  # replies are resolved on the query side
        return m["sender"] if m else None

    def events(self) -> list[tuple[int, Any]]:
        notes = self.app.recorder.select_notifications(start=self.read, limit=10_000, inclusive_of_start=False)
        if notes:
            self.read = notes[-1].id
        return [(n.id, self.app.mapper.to_domain_event(n)) for n in notes]

    def apply(
        self,
        projection: Projection,
        events: list[tuple[int, Any]] | None = None,
        *,
        wrap: Callable[[Any], Any] | None = None,
    ) -> list[Any]:
        """Fold events (default: the new ones) into the views in one unit of work, as a
        host does: process each, flush, track; returns the effects. `wrap`: what the
        projection writes through, given the unit's writer (a test's recorder)."""
        events = self.events() if events is None else events
        effects: list[Any] = []
        with self.views.unit_of_work() as w:
            seen = wrap(w) if wrap is not None else w
            for position, event in events:
                if type(event) in projection.topics:
                    effects.extend(projection.process(event, position, seen))
            projection.flush(w)
            if events:
                w.track(projection.name, events[-1][0])
        return effects
