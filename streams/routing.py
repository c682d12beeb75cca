"""Which partition of the event topic an event's record lands in: the one place that says
it, for the relay (which produces), the replicas (whose fresh reads of one conversation
wait for that conversation's partition only, README "Fresh reads") and the tests.

The relay's records are keyed (streams/relay.py `RoutingKeys`): a conversation's events
and its members' reads by the conversation's aggregate id. Its producer sets
`partitioner = PARTITIONER`, librdkafka's `consistent_random`: a keyed record goes to
CRC-32 (IEEE, zlib's) of the key bytes modulo the partition count (a record without a key
to a random partition; the relay's watermarks name their partition explicitly). Java's
default partitioner (murmur2) would place keys elsewhere: a producer of this topic must
use the same setting. tests/distributed/test_routing.py checks `partition_of` against
where a real producer put keyed records."""

from __future__ import annotations

import zlib

from domain.conversation import Conversation

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
