"""Where the relay has got to, read back from the event topic: the largest log position
(an event's or a watermark's, streams/records.py) among the last committed records of its
partitions, as a read_committed consumer sees them (docs/adr/0013-relay-and-watermarks.md).

The relay reads it once at start (it resumes after it); an API replica reads it for
/metrics and /readyz with one long-lived `position_consumer`; the tests read it to know what
is in the topic. Nothing is stored besides the topic itself: the position is committed in
the same Kafka transaction as the records."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from streams.kafka import kafka_error
from streams.records import MAX_RECORD_BYTES, position_of

# The relay's loggers: these reads are the relay's (its start) and about the relay.
log = logging.getLogger("fanout.relay")
rdkafka_log = logging.getLogger("fanout.relay.rdkafka")

# How many records back from the end of each partition the position search starts; it
# widens (x8) while a partition shows no committed fanout record in the window (aborted
# transactions of killed instances leave up to `batch` + 1 records each behind).
POSITION_WINDOW = 2048
# A new topic's partitions (or a restarted broker's) answer these until a leader is known.
_NOT_READY = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)


class PositionUnreadable(RuntimeError):
    """Kafka did not answer, or the end of the topic could not be read in time."""


def position_consumer(brokers: str) -> Consumer:
    """A consumer for `relayed_position(..., consumer=)` (never joins a group)."""
    return _position_consumer(brokers)


def _position_consumer(brokers: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"fanout-relay-position-{uuid.uuid4().hex[:12]}",  # never joined nor committed
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "allow.auto.create.topics": False,
            "fetch.max.bytes": MAX_RECORD_BYTES * 2,
            "max.partition.fetch.bytes": MAX_RECORD_BYTES,
            # It reads to the end and stops: a fetch parked at the end for the default 500 ms
            # would hold the next call's metadata request (same connection) that long.
            "fetch.wait.max.ms": 10,
            "socket.connection.setup.timeout.ms": 10_000,
            "logger": rdkafka_log,
        }
    )


def relayed_position(
    brokers: str,
    topic: str,
    *,
    timeout: float = 30.0,
    window: int = POSITION_WINDOW,
    consumer: Consumer | None = None,
) -> int:
    """The log position the relay has published to `topic`, as a read_committed consumer
    sees it: the largest position header (event or watermark) among the last committed
    records of the partitions; 0 when the topic is missing or empty.

    Each partition is read from `window` records before its end (the end is the last
    stable offset for read_committed) to the end; a partition whose window holds no
    committed fanout record (only aborted records and transaction markers) is read again
    from further back. Cheap (a few small fetches), so /metrics, /readyz and the relay's
    lag can call it. A caller that asks often passes its own long-lived `consumer`
    (`position_consumer`, used by one thread at a time): creating and destroying a client
    per call while the broker restarts aborted the process inside librdkafka
    (rd_kafka_enq_once_del_source_return assertion)."""
    owned = consumer is None
    consumer = _position_consumer(brokers) if consumer is None else consumer
    try:
        try:
            md = consumer.list_topics(topic, timeout=min(timeout, 10.0))
        except KafkaException as exc:
            raise PositionUnreadable(f"Kafka at {brokers} did not answer: {exc}") from None
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            return 0
        try:
            found = _last_positions(consumer, topic, sorted(t.partitions), timeout, window)
        except KafkaException as exc:
            raise PositionUnreadable(f"reading the end of {topic} at {brokers}: {exc}") from None
        return max(found.values(), default=0)
    finally:
        if owned:
            consumer.close()


def _last_positions(
    consumer: Consumer, topic: str, partitions: Sequence[int], timeout: float, window: int
) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    bounds: dict[int, tuple[int, int]] = {}
    for p in partitions:
        while True:  # a new topic's partitions may have no leader yet (NOT_LEADER_FOR_PARTITION)
            try:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=max(1.0, timeout / 4))
                break
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None or not (err.retriable() or err.code() in _NOT_READY) or time.monotonic() > deadline:
                    raise PositionUnreadable(f"cannot read the offsets of {topic}[{p}]: {exc}") from None
                time.sleep(0.2)
        if hi > lo:
            bounds[p] = (lo, hi)
    result: dict[int, int] = {}
    pending = dict(bounds)
    while pending:
        starts = {p: max(lo, hi - window) for p, (lo, hi) in pending.items()}
        consumer.assign([TopicPartition(topic, p, off) for p, off in starts.items()])
        found: dict[int, int] = {}
        done: set[int] = set()
        while done != set(pending):
            if time.monotonic() > deadline:
                raise PositionUnreadable(f"reading the end of {topic} took longer than {timeout:.0f}s")
            for m in consumer.consume(1000, 0.05):  # returns at the timeout when fewer arrive
                part = m.partition()
                err = m.error()
                if part is None or part not in pending:
                    continue
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(part)
                        continue
                    raise PositionUnreadable(f"reading {topic}[{part}]: {err}")
                h = m.headers()
                pos = position_of(list(h.items()) if isinstance(h, dict) else h)
                if pos is not None:
                    found[part] = max(found.get(part, 0), pos)
                off = m.offset()
                if off is not None and off >= pending[part][1] - 1:
                    done.add(part)
            # The end may be control records only (no EOF event before them): compare positions.
            for tp in consumer.position([TopicPartition(topic, p) for p in pending if p not in done]):
                if tp.offset >= pending[tp.partition][1]:
                    done.add(tp.partition)
        for p in list(pending):
            if p in found or starts[p] <= pending[p][0]:
                result[p] = found.get(p, 0)
                del pending[p]
        if pending:
            log.debug(
                "no committed record in the last %d of %s %s: reading further back", window, topic, sorted(pending)
            )
        window *= 8
    consumer.unassign()
    return result
