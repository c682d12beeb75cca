"""Which partition of the event topic an event's record lands in: the one place that says
it, for the relay (which produces), the replicas (whose fresh reads of one conversation
wait for that conversation's partition only, README "Fresh reads") and the tests.

The key of each event's record is `RoutingKeys` (below): a conversation's events and its
members' reads by the conversation's aggregate id, a tier's and its reviews' events by the
tier's id, anything else by its own aggregate id. The relay's producer sets
`partitioner = PARTITIONER`, librdkafka's `consistent_random`: a keyed record goes to
CRC-32 (IEEE, zlib's) of the key bytes modulo the partition count (a record without a key
to a random partition; the relay's watermarks name their partition explicitly). Java's
default partitioner (murmur2) would place keys elsewhere: a producer of this topic must
use the same setting. tests/distributed/test_routing.py checks `partition_of` against
where a real producer put keyed records."""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.persistence import Notification
from eventsourcing.utils import resolve_topic

from domain.conversation import Conversation
from domain.reads import MemberReadState
from domain.review import Review
from domain.tier import Tier

# librdkafka's partitioner of the relay's producer (its default, set explicitly so a change
# of default cannot move keys): CRC-32 of the key modulo partitions; no key: random.
PARTITIONER = "consistent_random"


def partition_of(key: str | bytes, partitions: int) -> int:
    """The partition a record with this (non-empty) key goes to under PARTITIONER."""
    data = key.encode() if isinstance(key, str) else key
    if not data:
        raise ValueError("a record without a key goes to a random partition")
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions}")
    return zlib.crc32(data) % partitions


def conversation_key(tenant: str, conversation_id: str) -> str:
    """The routing key of a conversation's events and of its members' reads (ADR-0013)."""
    return str(Conversation.create_id(tenant, conversation_id))


def conversation_partition(tenant: str, conversation_id: str, partitions: int) -> int:
    """The partition that holds every event a view of this conversation is built from: its
    head, messages, delivery records and its members' read states."""
    return partition_of(conversation_key(tenant, conversation_id), partitions)


# -- the key of each event's record ----------------------------------------------------------


class RoutingKeys:
    """The key of each event's record: it decides the partition (`partition_of`: CRC-32 of
    the key modulo partitions), and Kafka keeps the order of one key's records.

    * Conversation events: str(originator_id), the conversation's aggregate id;
    * MemberReadState events (a member's reads, ADR-0018): the key of THEIR CONVERSATION,
      str(Conversation.create_id(tenant, conversation_id)), so they reach the partition of
      the conversation's events in log order (the projection's head-position skip, ADR-0012,
      needs that). Every such event carries tenant and conversation_id; the key is decoded
      once per member stream and then cached by originator id;
    * Tier events: str(originator_id), i.e. str(Tier.create_id(tenant, size_bucket));
    * Review events: the key of THEIR TIER, str(Tier.create_id(tenant, size_bucket)), so a
      review's decision and the tier change it causes are in one partition, in log order.
      Review.Opened carries tenant and size_bucket; Review.Decided does not, so its tier
      comes from a cache filled from the Opened events relayed by this process, or, after
      a restart (the cache is empty then), from the review's first version in the store
      (`app.repository.get(review_id, version=1)`);
    * any other aggregate (TenantQuota, ...): str(originator_id).

    The event class is resolved from the stored topic with eventsourcing's resolve_topic,
    the first step of `app.mapper.to_domain_event` (so the legacy "domain.tier:Review.*"
    topics resolve to Review's classes too); only Review.Opened is decoded in full
    (with `app.mapper.to_domain_event`), to read its tenant and size bucket."""

    def __init__(self, app: Application[Any], cache_size: int = 100_000) -> None:
        self.app = app
        self.cache_size = cache_size
        self._review_tier: OrderedDict[UUID, str] = OrderedDict()
        self._read_conversation: OrderedDict[UUID, str] = OrderedDict()
        self.lookups = 0  # reviews whose tier came from the store

    def key(self, note: Notification) -> str:
        originator = as_uuid(note.originator_id)
        try:
            cls: Any = resolve_topic(note.topic)
        except Exception:  # a topic this code does not know: keep the aggregate's order at least
            return str(originator)
        if isinstance(cls, type) and issubclass(cls, MemberReadState.Event):
            return self._conversation_of_reads(originator, note)
        if isinstance(cls, type) and issubclass(cls, Review.Opened):
            opened: Any = self.app.mapper.to_domain_event(note)
            return self._remember(originator, opened.tenant, opened.size_bucket)
        if isinstance(cls, type) and issubclass(cls, Review.Event):
            found = self._review_tier.get(originator)
            if found is not None:
                self._review_tier.move_to_end(originator)
                return found
            self.lookups += 1
            review: Any = self.app.repository.get(originator, version=1)
            return self._remember(originator, review.tenant, review.size_bucket)
        return str(originator)

    def _conversation_of_reads(self, originator: UUID, note: Notification) -> str:
        found = self._read_conversation.get(originator)
        if found is not None:
            self._read_conversation.move_to_end(originator)
            return found
        read: Any = self.app.mapper.to_domain_event(note)
        key = conversation_key(read.tenant, read.conversation_id)
        self._read_conversation[originator] = key
        while len(self._read_conversation) > self.cache_size:
            self._read_conversation.popitem(last=False)
        return key

    def _remember(self, review_id: UUID, tenant: str, size_bucket: str) -> str:
        key = str(Tier.create_id(tenant, size_bucket))
        self._review_tier[review_id] = key
        self._review_tier.move_to_end(review_id)
        while len(self._review_tier) > self.cache_size:
            self._review_tier.popitem(last=False)
        return key


def as_uuid(value: UUID | str) -> UUID:
    """An originator id as the library hands it (a UUID, or its text from some recorders)."""
    return value if isinstance(value, UUID) else UUID(str(value))
