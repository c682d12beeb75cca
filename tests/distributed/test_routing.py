"""Where a keyed record lands (streams/routing.py) against the REAL Kafka: `partition_of`
must say where the relay's producer (librdkafka, `partitioner = PARTITIONER`) puts a key,
because a replica's fresh read of one conversation waits for that partition only
(README "Fresh reads"). A wrong function would let such a read answer before the views
hold the write it asked for."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from domain.conversation import Conversation
from fanout.urls import kafka_settings
from streams.kafka import ensure_topic
from streams.routing import PARTITIONER, conversation_key, conversation_partition, partition_of

TENANTS = ("acme", "globex", "t-9.x_y")


def keys(count: int, seed: int) -> list[str]:
    """Conversation keys as the relay makes them, and a few odd ids (non-ASCII, long)."""
    rnd = random.Random(seed)
    out = [conversation_key(rnd.choice(TENANTS), f"c{rnd.randrange(10**9)}") for _ in range(count)]
    out += [conversation_key("acme", cid) for cid in ("général", "日本語", "a/b", "x" * 128, "🙂")]
    return out


@pytest.fixture
def topics(fresh_kafka: str) -> Iterator[tuple[str, str, list[str]]]:
    """(brokers, a topic name no other test uses, the topics to delete afterwards)."""
    k = kafka_settings(fresh_kafka)
    names: list[str] = []
    yield k.brokers, k.topic, names
    admin = AdminClient({"bootstrap.servers": k.brokers})
    for f in admin.delete_topics(names, operation_timeout=10).values() if names else []:
        with contextlib.suppress(Exception):
            f.result(15)


def landed(brokers: str, topic: str, partitions: int, expected: int) -> dict[str, int]:
    """key -> the partition a consumer finds it in."""
    c = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "routing-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[str, int] = {}
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while eof != set(range(partitions)) or len(out) < expected:
            assert time.monotonic() < deadline, f"read {len(out)} of {expected} records of {topic}"
            for m in c.consume(1000, 0.2):
                err = m.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    eof.add(m.partition() or 0)
                    continue
                key = m.key()
                assert key is not None
                out[key.decode()] = m.partition() or 0
        return out
    finally:
        c.close()


@pytest.mark.parametrize("partitions", [4, 7, 16])
def test_partition_of_says_where_the_relays_producer_puts_a_key(
    topics: tuple[str, str, list[str]], partitions: int
) -> None:
    brokers, topic, names = topics
    names.append(topic)
    assert ensure_topic(brokers, topic, partitions, 1) == partitions
    sent = keys(600, seed=partitions)
    # the relay's setting, and librdkafka's default (the same today: a changed default must show here)
    for conf in ({"partitioner": PARTITIONER}, {}):
        p = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, "acks": "all", **conf})
        for key in sent:
            p.produce(topic, key=key, value=b"")
        assert p.flush(30) == 0
    where = landed(brokers, topic, partitions, len(sent))
    assert len(where) == len(sent)
    wrong = {key: (p, partition_of(key, partitions)) for key, p in where.items() if p != partition_of(key, partitions)}
    assert not wrong, f"{len(wrong)} keys elsewhere than partition_of says (landed, predicted): {list(wrong.items())[:5]}"
    assert len(set(where.values())) == partitions  # every partition got some: the check says something


def test_a_conversations_partition_is_that_of_its_aggregate_id() -> None:
    for tenant, cid in (("acme", "general"), ("globex", "日本語"), ("acme", "a/b")):
        key = str(Conversation.create_id(tenant, cid))
        assert conversation_key(tenant, cid) == key
        for n in (1, 4, 6, 16):
            assert conversation_partition(tenant, cid, n) == partition_of(key, n) == partition_of(key.encode(), n)
    with pytest.raises(ValueError):
        partition_of("", 4)
    with pytest.raises(ValueError):
        partition_of("k", 0)
