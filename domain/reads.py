"""A member's read seq in one conversation, in a stream of its own (ADR-0018).

MARK_READ appends to this stream only: members reading never contend with each other nor
with the conversation's sends. The conversation validates the read (membership, read seq
at or below the latest) and keeps the members' activity; this aggregate only remembers
the highest read seq marked, which only moves forward.

Every event carries tenant, conversation_id, user_id, read_seq and at, so a projection
applies one without any other event; the relay keys them by the CONVERSATION's aggregate
id, so they reach the partition of the conversation's own events, in log order."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

from domain.identity import check_id, scoped_name

NAMESPACE = UUID("0b8e6c52-7f3d-4a49-8c1e-5d2f9a4e7b31")


class MemberReadState(Aggregate):
    """(tenant, conversation, user) -> the highest read seq a MARK_READ recorded."""

    class Event(Aggregate.Event):
        tenant: str
        conversation_id: str
        user_id: str
        read_seq: int
        at: float

    class Created(Event, Aggregate.Created):
        """The first MARK_READ of this member in this conversation (a read like the others)."""

    class ReadMarked(Event):
        pass

    @staticmethod
    def create_id(tenant: str, conversation_id: str, user_id: str, *_: Any, **__: Any) -> UUID:
        # ADR-0008: `reads/tenant/<len>:conversation/user`: the tenant has no '/', and the
        # conversation id's length ends it, so the name is injective although ids may hold '/'.
        cid = check_id(conversation_id, "conversation_id")
        return uuid5(NAMESPACE, scoped_name("reads", tenant, f"{len(cid)}:{cid}/{check_id(user_id, 'user_id')}"))

    @event(Created)
    def __init__(self, tenant: str, conversation_id: str, user_id: str, read_seq: int, at: float) -> None:
        self.tenant = tenant
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.read_seq = read_seq
        self.at = at

    def mark(self, read_seq: int, now: float) -> bool:
        """Record a read seq; False (nothing recorded) unless it moves forward."""
        if read_seq <= self.read_seq:
            return False
        self._read_marked(
            tenant=self.tenant, conversation_id=self.conversation_id, user_id=self.user_id, read_seq=read_seq, at=now
        )
        return True

    @event(ReadMarked)
    def _read_marked(self, tenant: str, conversation_id: str, user_id: str, read_seq: int, at: float) -> None:
        self.read_seq = read_seq
        self.at = at


READ_EVENTS: tuple[type[MemberReadState.Event], ...] = (MemberReadState.Created, MemberReadState.ReadMarked)
