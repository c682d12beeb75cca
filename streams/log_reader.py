"""Re-reading a range of one partition of the event topic, for a projection host that
finds its views lost writes (a Cassandra crash dropped acknowledged units) or a gap between
where its views stand and where Kafka's committed offsets resume (ADR-0021).

The host knows the offset its views stand at (`LogPosition.next_offset`, written with the
tracking) and the offset of the first record it was handed; the records in between are read
here, read_committed like the worker's own consumer, and applied before the others."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from streams.records import BadRecord, EventRecord, Watermark, decode

POLL = 0.5  # seconds per poll


class LogGapUnreadable(RuntimeError):
    """The range could not be read in time (Kafka away): the host retries the unit later."""


class KafkaPartitionReader:
    """Reads [start, end) of one partition of `topic`; one consumer, kept between reads
    (assigned per read, no consumer group: nothing is committed)."""

    def __init__(self, brokers: str, topic: str, *, timeout: float = 60.0) -> None:
        self.brokers = brokers
        self.topic = topic
        self.timeout = timeout
        self._consumer: Consumer | None = None

    def _open(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    "bootstrap.servers": self.brokers,
                    "group.id": f"fanout-log-reader-{uuid.uuid4().hex}",  # never joins: assign() only
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "log_level": 3,  # errors only: the host logs what matters
                }
            )
        return self._consumer

    def read(self, partition: int, start: int, end: int) -> list[EventRecord | Watermark]:
        """The records of offsets start <= offset < end, in order (aborted ones left out)."""
        if end <= start:
            return []
        c = self._open()
        c.assign([TopicPartition(self.topic, partition, start)])
        out: list[EventRecord | Watermark] = []
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                if time.monotonic() > deadline:
                    raise LogGapUnreadable(
                        f"could not read offsets {start}..{end - 1} of {self.topic}[{partition}] "
                        f"within {self.timeout:.0f} s (got {len(out)} records)"
                    )
                msg: Any = c.poll(POLL)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        break
                    if err.fatal() or not err.retriable():
                        raise LogGapUnreadable(f"reading {self.topic}[{partition}]: {err}")
                    continue
                if msg.offset() >= end:
                    break
                try:
                    out.append(decode(msg.headers(), msg.value(), msg.offset()))
                except BadRecord:
                    continue  # logged by the worker when it meets it; never applies
        finally:
            c.unassign()
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
