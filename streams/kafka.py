"""Kafka's topics in one place: creating one, and reading its partition count.

Who creates which topic, with what (so that the count never depends on which process starts
first):

* the **event topic** (FANOUT_LOG's `topic`): the relay, which writes it (streams/relay.py), and
  a worker that starts before it (its composition root, fanout/bootstrap/worker.py), once a
  process; both with FANOUT_LOG's `partitions`, `replication` and `min_insync`, and
  records of up to `streams.records.MAX_RECORD_BYTES`;
* the **pushes topic** (`<topic>.pushes`): the workers' publisher and the API replicas'
  subscriber, both with the event topic's `partitions` from the same URL, records of up to
  `streams.push_records.MAX_PUSH_BYTES` (a 100k-member push with its member lists).

An existing topic is left as it is: its partition count is the one the cluster reports."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from streams.records import MAX_RECORD_BYTES

rdkafka_log = logging.getLogger("fanout.kafka.rdkafka")
log = logging.getLogger("fanout.kafka")


class KafkaSettings(Protocol):
    """FANOUT_LOG as the composition root parsed it (fanout/urls.py `kafka_settings`): the
    brokers, the event topic, and what the topics are created with. Taken whole by whatever
    creates or follows them (the relay, a worker's publisher, a replica's subscriber)."""

    @property
    def brokers(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def partitions(self) -> int: ...
    @property
    def replication(self) -> int: ...
    @property
    def min_insync(self) -> int: ...


class TopicUnavailable(RuntimeError):
    """A topic could not be created, or did not show with a leader for every partition; the
    message names the brokers and what went wrong."""


def topic_config(config: dict[str, str], min_insync: int) -> dict[str, str]:
    """`config` plus min.insync.replicas when `min_insync` > 0 (FANOUT_LOG's ?min_insync=)."""
    return {**config, "min.insync.replicas": str(min_insync)} if min_insync > 0 else config


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError a confluent-kafka exception carries (None for any other exception)."""
    arg = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def ensure_topic(
    brokers: str,
    topic: str,
    partitions: int,
    replication: int = 1,
    *,
    max_message_bytes: int = MAX_RECORD_BYTES,
    min_insync: int = 0,
    timeout: float = 15.0,
    logger: logging.Logger = rdkafka_log,
) -> int:
    """Create the topic if missing (idempotent: a racing creator is harmless) and return its
    partition count once every partition has a leader (an existing topic keeps its own
    count). `min_insync` > 0 sets the new topic's min.insync.replicas (0: the broker's
    default). `logger` takes librdkafka's own lines (the caller's, so that it mutes them).
    TopicUnavailable when Kafka does not answer or refuses."""
    conf: dict[str, Any] = {
        "bootstrap.servers": brokers,
        "socket.connection.setup.timeout.ms": int(timeout * 1000),
        "logger": logger,
    }
    admin = AdminClient(conf)
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication,
        config=topic_config({"max.message.bytes": str(max_message_bytes)}, min_insync),
    )
    futures = admin.create_topics([new], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic].result(timeout + 5)  # `admin` stays referenced until the future resolves
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is not None and err.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
            raise TopicUnavailable(f"Kafka at {brokers} did not answer within {timeout:.0f}s ({err.str()})") from None
        if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise TopicUnavailable(f"cannot create the Kafka topic {topic!r} at {brokers}: {err or exc}") from None
    except Exception as exc:  # concurrent.futures.TimeoutError and the like
        raise TopicUnavailable(f"Kafka at {brokers} did not answer within {timeout:.0f}s: {exc!r}") from None
    deadline = time.monotonic() + timeout
    while True:  # metadata may lag the creation by a moment
        try:
            md = admin.list_topics(topic, timeout=5)
        except KafkaException as exc:
            raise TopicUnavailable(f"Kafka at {brokers} did not answer: {exc}") from None
        t = md.topics.get(topic)
        if (
            t is not None
            and t.error is None
            and t.partitions
            and all(pm.error is None and pm.leader >= 0 for pm in t.partitions.values())
        ):
            found = len(t.partitions)
            if found != partitions:
                log.warning("topic %s has %d partitions (asked for %d): using %d", topic, found, partitions, found)
            return found
        if time.monotonic() > deadline:
            raise TopicUnavailable(f"topic {topic!r} does not show with a leader for every partition at {brokers}")
        time.sleep(0.05)


def ensure_event_topic(kafka: KafkaSettings, *, timeout: float = 15.0, logger: logging.Logger = rdkafka_log) -> int:
    """The event topic of FANOUT_LOG, created if missing with its partitions, replication and
    min_insync and records of up to MAX_RECORD_BYTES; its partition count (ensure_topic)."""
    return ensure_topic(
        kafka.brokers,
        kafka.topic,
        kafka.partitions,
        kafka.replication,
        max_message_bytes=MAX_RECORD_BYTES,
        min_insync=kafka.min_insync,
        timeout=timeout,
        logger=logger,
    )


def partition_count(brokers: str, topic: str, timeout: float = 30.0) -> int:
    """The partition count of an existing topic; LookupError when there is no such topic."""
    conf: dict[str, Any] = {"bootstrap.servers": brokers, "logger": rdkafka_log}
    admin = AdminClient(conf)
    meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise LookupError(f"Kafka topic {topic!r} not found")
    return len(meta.partitions)


def consumer_group_members(brokers: str, group: str, timeout: float = 5.0, *, admin: Any = None) -> int:
    """Members of a Kafka consumer group (0 when it is empty or unknown). A caller that
    asks often passes its own long-lived AdminClient."""
    if admin is None:
        admin = AdminClient({"bootstrap.servers": brokers, "socket.timeout.ms": int(timeout * 1000)})
    deadline = time.monotonic() + timeout
    while True:
        futures = admin.describe_consumer_groups([group], request_timeout=timeout)
        try:
            description = futures[group].result(timeout=timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = getattr(error, "code", lambda: None)()
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return 0
            # The group's coordinator moving or loading (NOT_COORDINATOR seen by the e2e
            # suite): ask again within the timeout, not "the workers are unknown"
            moving = (
                KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                KafkaError.COORDINATOR_NOT_AVAILABLE,
            )
            transient = code in moving or getattr(error, "retriable", lambda: False)()
            if transient and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise
        return len(description.members)
