"""Reads of the event store's streams, for what no view keeps: the MessageSent event of one
conversation_seq (the delivery record of a message the views have not applied yet) and the
history of a tenant's tiers. They read the store, not the command side's aggregates: no
command lock."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.persistence import ApplicationRecorder, Mapper
from eventsourcing.utils import get_topic

from domain.conversation import Conversation
from domain.params import SizeBucket
from domain.tier import Tier

SENT_SCAN_PAGE = 50
_MESSAGE_SENT_TOPIC = get_topic(Conversation.MessageSent)


class History:
    """The event store of an application (its recorder and its mapper), read."""

    def __init__(self, recorder: ApplicationRecorder, mapper: Mapper[UUID]) -> None:
        self.recorder = recorder
        self.mapper = mapper

    def sent_message(self, tenant: str, conversation_id: str, seq: int) -> Conversation.MessageSent | None:
        """The MessageSent event of one conversation_seq, read from the event store newest
        first. The aggregate keeps no message ids per seq (its snapshot stays small); this
        serves the delivery record of a message the views have not applied yet, which is
        a recent one, so the backward scan is short."""
        aggregate_id = Conversation.create_id(tenant, conversation_id)
        lte: int | None = None
        while True:
            page = self.recorder.select_events(aggregate_id, lte=lte, desc=True, limit=SENT_SCAN_PAGE)
            for stored in page:
                if stored.topic != _MESSAGE_SENT_TOPIC:
                    continue
                sent = self.mapper.to_domain_event(stored)
                if not isinstance(sent, Conversation.MessageSent):
                    continue
                if sent.seq == seq:
                    return sent
                if sent.seq < seq:
                    return None
            if len(page) < SENT_SCAN_PAGE:
                return None
            lte = page[-1].originator_version - 1

    def tier_history(self, tenant: str) -> list[dict[str, Any]]:
        """Every change of the tenant's tiers, oldest first, read from their event streams (the
        tier view keeps only the last state): enabled by which review with which parameters,
        rolled back by whom and why, each conversation entering and leaving mention_only under
        it."""
        out: list[dict[str, Any]] = []
        for b in SizeBucket:
            for stored in self.recorder.select_events(Tier.create_id(tenant, b.value)):
                e = self.mapper.to_domain_event(stored)
                stamp = getattr(e, "timestamp", None)  # when it was recorded (Entered/Exited carry no `at`)
                at = stamp.timestamp() if stamp is not None else 0.0
                item: dict[str, Any] = {"size_bucket": b.value, "event": type(e).__name__, "at": at, "recorded_at": at}
                if isinstance(e, Tier.Enabled):
                    item.update(at=e.at, review_id=e.review_id, read_diffusion_min_saving=e.min_saving,
                                read_diffusion_max_active_ratio=e.max_active_ratio)  # fmt: skip
                elif isinstance(e, Tier.RolledBack):
                    item.update(at=e.at, by=e.by, reason=e.reason)
                elif isinstance(e, Tier.ConversationEntered | Tier.ConversationExited):
                    item["conversation_id"] = e.conversation_id
                elif not isinstance(e, Tier.Created):
                    continue
                out.append(item)
        # in the order the events were recorded (a stream's own order within it: the sort is stable)
        return sorted(out, key=lambda i: i["recorded_at"])
