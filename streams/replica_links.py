"""An API replica's links to the log and the workers (`fanout.distributed.ReplicaLinks`,
built by the composition root): the relay's committed position, the live workers (their
heartbeats on the pushes topic, ADR-0019) and the online pushes and view positions the
workers publish after their commits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from projections.delivery import Delivered
from projections.failures import first_line
from projections.hosting import ViewsTracked
from streams.heartbeats import WorkerBeats
from streams.kafka import KafkaSettings, TopicUnavailable
from streams.kafka_health import process_health
from streams.positions import position_consumer, relayed_position
from streams.pushes import PushSubscriber


class Subscription:
    """The pushes subscription: close() stops its consumer thread."""

    def __init__(self, subscriber: PushSubscriber) -> None:
        self._subscriber = subscriber

    def close(self) -> None:
        self._subscriber.stop()


class KafkaUnreachable(RuntimeError):
    """Kafka did not answer at start-up; the message names the URL and what to do."""


class KafkaReplicaLinks:
    """What an API replica asks of Kafka: the relay's committed position, the live workers
    (their heartbeats on the pushes topic) and the online pushes the workers publish."""

    def __init__(self, kafka: KafkaSettings, *, unreachable: type[Exception] = KafkaUnreachable) -> None:
        self.kafka = kafka
        self.unreachable = unreachable  # raised when Kafka does not answer at start-up (the caller's error)
        self.beats = WorkerBeats()
        # Kafka down: one line and a summary every 30 s, not librdkafka's line per attempt
        self.health = process_health(kafka.brokers)
        # One long-lived client, one caller at a time: a client created and destroyed per check
        # while the broker restarted aborted the process inside librdkafka.
        self._lock = threading.Lock()
        self._consumer: Any = None
        self._subscribed = False

    def relayed_position(self) -> int:
        with self._lock:
            if self._consumer is None:
                self._consumer = position_consumer(self.kafka.brokers)
            try:
                position = relayed_position(self.kafka.brokers, self.kafka.topic, timeout=5.0, consumer=self._consumer)
            except Exception as exc:
                self.health.failed(f"{type(exc).__name__}: {exc}")
                raise
            self.health.reachable()
            return position

    def workers(self) -> int:
        """Workers whose heartbeat reached this replica lately (ADR-0019): no admin request
        to Kafka's group coordinator (one in flight during a broker restart aborted the
        process inside librdkafka)."""
        if not self._subscribed:
            raise RuntimeError("the workers are known from their heartbeats: subscribe_pushes first")
        return self.beats.count()

    def worker_partitions(self) -> set[int]:
        return self.beats.partitions()

    def worker_counters(self) -> dict[str, dict[str, int]]:
        return self.beats.counters()

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def subscribe_pushes(
        self,
        callback: Callable[[Delivered], None],
        on_tracked: Callable[[ViewsTracked], None] | None = None,
        wants: Callable[[str], bool] | None = None,
    ) -> Subscription:
        muted, self.health.muted = self.health.muted, True  # a start-up failure is one line (below)
        try:
            sub = PushSubscriber.of_log(
                self.kafka, callback, on_beat=self.beats.seen, on_tracked=on_tracked, wants=wants
            ).start()
        except (KafkaException, TopicUnavailable) as exc:
            raise self.unreachable(
                f"FANOUT_LOG: Kafka at {self.kafka.brokers} does not answer ({first_line(exc)}): start it, "
                "or name the right host and port in FANOUT_LOG"
            ) from None
        finally:
            self.health.muted = muted
        self.health.reachable()
        self._subscribed = True
        return Subscription(sub)
