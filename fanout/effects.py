"""What is done with the effects a unit of work leaves, after it committed (ADR-0012: the
views first, then the world hears of it), in one place for every process.

A projection returns effects (`projections/hosting.py`): `Delivered` (a message reached
its members: online pushes, invariant O), `ViewsTracked` (the positions the commit left),
`ReviewTrigger` (a capacity trigger: ADR decision 3, it only opens a review; a person
decides). Each process acts on them with handlers, and the composition root says which
(cosmicpython's bootstrap injecting its handlers into the message bus):

* the embedded runtime pushes `Delivered` to its own sockets and opens the reviews;
* a projection worker opens the reviews (it publishes `Delivered` and `ViewsTracked` to the
  pushes topic itself, `streams/worker.py`: Kafka plumbing stays in streams/);
* an API replica of the distributed runtime pushes the `Delivered` it receives from the
  pushes topic to its own sockets.

A handler that fails is logged and the next effect is handled: the views are committed, a
push lost is served by the mailbox, a review not opened is opened by the next trigger."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from projections.capacity import ReviewTrigger
from projections.delivery import Delivered
from projections.hosting import Effect

log = logging.getLogger("fanout.effects")

Handler = Callable[[Any], None]


class Effects:
    """Acts on the effects of one committed unit: each by the handlers of its type, in order."""

    def __init__(self, handlers: Mapping[type, Sequence[Handler]]) -> None:
        self.handlers = {kind: tuple(hs) for kind, hs in handlers.items()}

    def __call__(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            for handle in self.handlers.get(type(effect), ()):
                try:
                    handle(effect)
                except Exception:
                    log.exception("could not act on %s (the views are committed)", type(effect).__name__)


class Hub(Protocol):
    def deliver(self, effect: Delivered) -> int: ...


class PushCounts(Protocol):
    def record_pushes(self, tenant: str, conversation_id: str, seq: int, pushes: int) -> None: ...


class Reviews(Protocol):
    def open_review(
        self,
        tenant: str,
        size_bucket: str,
        trigger: str,
        details: dict[str, Any],
        opened_by: str,
        review_key: str | None = None,
    ) -> Any: ...


def push_online(hub: Hub, views: PushCounts) -> Handler:
    """`Delivered` -> the members' sockets on this process; the pushes made are counted in
    the views (GET /v1/debug/pushes)."""

    def handle(effect: Delivered) -> None:
        pushes = hub.deliver(effect)
        if pushes:
            views.record_pushes(effect.tenant, effect.conversation_id, effect.seq, pushes)

    return handle


class Count:
    """How many times a handler did its work (the reviews this process opened: /metrics)."""

    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> None:
        self.value += 1


def open_review(app: Reviews, opened: Callable[[], None] | None = None) -> Handler:
    """`ReviewTrigger` -> a review opened by the capacity monitor (idempotent by its key)."""

    def handle(t: ReviewTrigger) -> None:
        app.open_review(t.tenant, t.size_bucket, t.trigger, t.details, "capacity-monitor", review_key=t.review_key)
        if opened is not None:
            opened()

    return handle
