"""The online-push channel between processes (invariant O across the wire).

A projection worker (`streams/worker.py`) publishes each `Delivered` effect, after the unit
of work that produced it has committed, as one JSON record on `<event topic>.pushes`, keyed
by conversation (a conversation's pushes keep their order within a partition). Every API
replica runs a `PushSubscriber`: it reads every partition of that topic from its end at the
moment it starts (no consumer group, nothing committed: a replica only pushes to the
sockets it holds now, and a device that was offline reads its mailbox), and hands each
`Delivered` to a callback (the replica's `PushHub.deliver`).

The same topic carries each worker's heartbeat (streams/heartbeats.py `WorkerBeat`): the
publisher sends them, the subscriber hands them to `on_beat` (a replica's `WorkerBeats`), also
those of the last BEAT_LOOKBACK records of each partition at start.

A push record carries its tenant in a Kafka header (TENANT_HEADER): a replica that holds no
socket of that tenant (`PushSubscriber(wants=)`, the replica's `PushHub.holds`) skips the
record without decoding it (14 us a 20-member push here, 8 ms a 100k-member one:
`bench/push_hub.py`, ADR-0055). The key is
not enough for that: `tenant/conversation` and a heartbeat's `worker/<id>` look alike when the
tenant is named `worker`.

And, after each unit of work, the positions it left in the views (`ViewsTracked`, kind
"tracked"): a replica learns how far the views are from them instead of reading the tracking
rows from Cassandra every few milliseconds (the replica still reads them, slowly, in
case a record is lost).

confluent-kafka, plain threads: nothing here needs an event loop."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from projections.delivery import Delivered
from projections.hosting import ViewsTracked
from streams.heartbeats import WorkerBeat, encode_beat
from streams.kafka import KafkaSettings, ensure_topic, kafka_error
from streams.push_records import MAX_PUSH_BYTES, TENANT_HEADER, decode, encode, encode_tracked, tenant_of

log = logging.getLogger("fanout.pushes")
# librdkafka's own lines of these clients (a broker down: one per attempt), as Python log
# records instead of stderr; streams/kafka_health.py turns them into one state line.
rdkafka_log = logging.getLogger("fanout.pushes.rdkafka")

BEAT_LOOKBACK = 64  # records per partition a subscriber reads back at start, for the latest beats


def pushes_topic(event_topic: str) -> str:
    return f"{event_topic}.pushes"


# -- topics -------------------------------------------------------------------------------


# A topic just created (or a broker just restarted) answers these until its leaders are known
# to the broker asked: asked again until the deadline.
_NOT_YET = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def offset_bounds(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """(low, high) offsets of a partition (Kafka's "watermark offsets", not the relay's
    watermark records); a partition whose leader is not known yet is asked again until
    `deadline` (seen at start-up right after the topic was created)."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()))
            return int(low), int(high)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is None or err.code() not in _NOT_YET or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def ensure_pushes_topic(brokers: str, topic: str, partitions: int, replication: int, min_insync: int) -> int:
    """The pushes topic, created by whichever of a worker and a replica comes first, with the
    event topic's partition count from FANOUT_LOG (streams/kafka.py)."""
    return ensure_topic(
        brokers,
        topic,
        partitions,
        replication,
        max_message_bytes=MAX_PUSH_BYTES,
        min_insync=min_insync,
        timeout=30.0,
        logger=rdkafka_log,
    )


# -- publishing (the worker, after its unit of work committed) ------------------------------


class PushPublisher:
    """Publishes Delivered effects. `publish` only queues (librdkafka sends within
    `linger_ms`); `flush` waits for the broker's acknowledgement. `on_delivered(sent_at)` is
    called for each record the broker acknowledged, with the wall-clock time it was sent at
    (Kafka was reachable after that). `partitions`: the event topic's count (FANOUT_LOG), the
    pushes topic's if this publisher creates it; no default, which would decide the count by
    whichever process starts first (streams/kafka.py)."""

    def __init__(
        self,
        brokers: str,
        topic: str,
        *,
        partitions: int,
        replication: int = 1,
        min_insync: int = 0,
        linger_ms: int = 2,
        on_delivered: Callable[[float], Any] | None = None,
    ) -> None:
        ensure_pushes_topic(brokers, topic, partitions, replication, min_insync)
        self.topic = topic
        self.on_delivered = on_delivered
        self.failed = 0
        self.published = 0
        self._producer = Producer(
            {
                "bootstrap.servers": brokers,
                "linger.ms": linger_ms,
                "enable.idempotence": True,
                "acks": "all",
                # A push names the members at send time: ~1.5 MB of JSON for 100k members
                # (about 0.3 MB compressed). The default 1 MB limit dropped every large-group push.
                "compression.type": "lz4",
                "message.max.bytes": MAX_PUSH_BYTES + 1024 * 1024,
                "logger": rdkafka_log,
            }
        )

    @classmethod
    def of_log(cls, kafka: KafkaSettings, *, on_delivered: Callable[[float], Any] | None = None) -> PushPublisher:
        """The publisher on the pushes topic of FANOUT_LOG's event topic, created if missing with its settings."""
        return cls(
            kafka.brokers,
            pushes_topic(kafka.topic),
            partitions=kafka.partitions,
            replication=kafka.replication,
            min_insync=kafka.min_insync,
            on_delivered=on_delivered,
        )

    def _report(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            log.warning("a push was not published: %s (the views hold the message; the mailbox serves it)", err)
        elif self.on_delivered is not None:
            self.on_delivered(msg.timestamp()[1] / 1000.0)

    def _beat_report(self, err: KafkaError | None, msg: Any) -> None:
        if err is None and self.on_delivered is not None:
            self.on_delivered(msg.timestamp()[1] / 1000.0)  # its create time, stamped by produce()

    def publish(self, effects: Iterable[Any]) -> int:
        """Publish the Delivered and ViewsTracked among `effects`; returns how many
        Delivered were queued."""
        n = 0
        for d in effects:
            headers: list[tuple[str, str | bytes | None]] | None = None
            if isinstance(d, ViewsTracked):
                key, value, report = b"tracked", encode_tracked(d), self._beat_report
            elif isinstance(d, Delivered):
                key, value, report = f"{d.tenant}/{d.conversation_id}".encode(), encode(d), self._report
                headers = [(TENANT_HEADER, d.tenant.encode())]
                n += 1
            else:
                continue
            while True:
                try:
                    self._producer.produce(self.topic, key=key, value=value, headers=headers, on_delivery=report)
                    break
                except BufferError:  # the local queue is full: let it drain
                    self._producer.poll(0.1)
        self._producer.poll(0)
        self.published += n
        return n

    def beat(self, b: WorkerBeat) -> None:
        """Queue a heartbeat (sent within linger_ms; a full local queue drops it: the next
        one follows within a second)."""
        try:
            self._producer.produce(
                self.topic, key=f"worker/{b.worker}".encode(), value=encode_beat(b), on_delivery=self._beat_report
            )
        except BufferError:
            log.warning("a heartbeat was not queued: the producer's local queue is full")
        self._producer.poll(0)

    def flush(self, timeout: float = 10.0) -> int:
        """Wait for every queued push; returns how many are still queued."""
        return int(self._producer.flush(timeout))

    def close(self) -> None:
        self.flush()


# -- subscribing (each API replica) ------------------------------------------------------


class PushSubscriber:
    """A consumer thread over every partition of the pushes topic, from its end at start()
    (explicit offsets: start() returns once they are fixed, so every push published after
    it returns is seen). No group, nothing committed. `callback(Delivered)` runs on the
    thread; its exceptions are logged. With `on_beat`, the last BEAT_LOOKBACK records of each
    partition are read back too, for their heartbeats only: a replica knows the live workers
    at once, not a beat interval after it starts. With `wants(tenant)`, a push of a tenant it
    answers False for is skipped undecoded (counted in `skipped`). `partitions`: as the
    publisher's, the event topic's count (no default)."""

    def __init__(
        self,
        brokers: str,
        topic: str,
        callback: Callable[[Delivered], Any],
        *,
        partitions: int,
        on_beat: Callable[[WorkerBeat, float], Any] | None = None,
        on_tracked: Callable[[ViewsTracked], Any] | None = None,
        wants: Callable[[str], bool] | None = None,
        poll: float = 0.2,
        replication: int = 1,
        min_insync: int = 0,
    ) -> None:
        self.brokers = brokers
        self.topic = topic
        self.replication = replication  # of the topic when this subscriber creates it (FANOUT_LOG)
        self.partitions = partitions  # likewise: the event topic's count, as the workers' publisher
        self.min_insync = min_insync
        self.callback = callback
        self.on_beat = on_beat  # (beat, seconds it waited in the topic before start)
        self.on_tracked = on_tracked  # the positions a worker's commit left in the views
        self.wants = wants  # whether a tenant's pushes are decoded at all (the replica holds its sockets)
        self.poll = poll
        self._ends: dict[int, int] = {}  # partition -> its end offset at start
        self.received = 0
        self.bad = 0
        self.skipped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None

    @classmethod
    def of_log(cls, kafka: KafkaSettings, callback: Callable[[Delivered], Any], **options: Any) -> PushSubscriber:
        """The subscriber to the pushes topic of FANOUT_LOG's event topic, created if missing
        with its settings; `options`: on_beat, on_tracked, wants, poll."""
        return cls(
            kafka.brokers,
            pushes_topic(kafka.topic),
            callback,
            partitions=kafka.partitions,
            replication=kafka.replication,
            min_insync=kafka.min_insync,
            **options,
        )

    def start(self, timeout: float = 30.0) -> PushSubscriber:
        ensure_pushes_topic(self.brokers, self.topic, self.partitions, self.replication, self.min_insync)
        consumer = Consumer(
            {
                "bootstrap.servers": self.brokers,
                "group.id": "fanout-push-subscriber",  # required by librdkafka; never joined (assign) nor committed
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "fetch.wait.max.ms": 50,
                "isolation.level": "read_committed",
                "fetch.max.bytes": MAX_PUSH_BYTES * 2,
                "max.partition.fetch.bytes": MAX_PUSH_BYTES,
                "enable.partition.eof": True,
                "logger": rdkafka_log,
            }
        )
        try:
            meta = consumer.list_topics(self.topic, timeout=timeout).topics[self.topic]
            tps = []
            starts: dict[int, int] = {}
            deadline = time.monotonic() + timeout
            for p in sorted(meta.partitions):
                low, high = offset_bounds(consumer, TopicPartition(self.topic, p), deadline)
                self._ends[p] = high
                starts[p] = max(low, high - (BEAT_LOOKBACK if self.on_beat is not None else 0))
                tps.append(TopicPartition(self.topic, p, starts[p]))
            consumer.assign(tps)
            self._read_back(consumer, starts, min(timeout, 10.0))
        except BaseException:
            consumer.close()
            raise
        self._consumer = consumer
        self._thread = threading.Thread(target=self._run, name="fanout-push-subscriber", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        try:
            while not self._stop.is_set():
                msg = consumer.poll(self.poll)
                if msg is not None:
                    self._handle(msg)
        finally:
            consumer.close()

    def _read_back(self, consumer: Consumer, starts: dict[int, int], timeout: float) -> None:
        """Before start() returns: the records read back for their heartbeats, up to where
        each partition ended at start (so `on_beat` has seen the live workers)."""
        pending = {p for p, end in self._ends.items() if end > starts[p]}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            p = msg.partition() or 0
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                pending.discard(p)
                continue
            self._handle(msg)
            if (msg.offset() or 0) >= self._ends.get(p, 0) - 1:
                pending.discard(p)

    def _handle(self, msg: Any) -> None:
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("push subscriber: %s", err)
            return
        before_start = (msg.offset() or 0) < self._ends.get(msg.partition() or 0, 0)
        tenant = tenant_of(msg)
        if tenant is not None:  # a push: never wanted from before start, nor of a tenant not wanted
            if before_start:
                return
            if self.wants is not None and not self.wants(tenant):
                self.skipped += 1
                return
        try:
            d = decode(msg.value() or b"")
        except ValueError as exc:
            if not before_start:
                self.bad += 1
                log.warning("push subscriber: skipped a record: %s", exc)
            return
        if isinstance(d, WorkerBeat):
            if self.on_beat is not None:
                self.on_beat(d, max(0.0, time.time() - d.at) if before_start else 0.0)
            return
        if before_start:
            return  # read back for the beats only: pushed before this replica held sockets
        if isinstance(d, ViewsTracked):
            if self.on_tracked is not None:
                try:
                    self.on_tracked(d)
                except Exception:
                    log.exception("push subscriber: the tracked-positions callback failed")
            return
        self.received += 1
        try:
            self.callback(d)
        except Exception:
            log.exception("push subscriber: the callback failed")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    close = stop
