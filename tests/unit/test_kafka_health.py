"""Kafka's reachability as one line, not a flood (streams/kafka_health.py):
the state changes and the summaries on a fake clock, and the gate that routes the Kafka
clients' log records (aiokafka's, librdkafka's through confluent-kafka's `logger`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from streams.kafka_health import ClientLogGate, KafkaHealth, is_connection_failure


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(clock: Clock) -> KafkaHealth:
    return KafkaHealth("127.0.0.1:9092", logger=logging.getLogger("test.kafka"), clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.kafka"]


def test_an_outage_is_one_line_then_a_summary_every_30_s_then_one_line_back(
    health: KafkaHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for i in range(76 * 65):  # 65 s of aiokafka's 76 errors a second
        clock.now = 1000.0 + i / 76
        health.failed(f"Unable connect to node with id 1: [Errno 111] Connect call failed (attempt {i})")
    clock.now = 1070.0
    health.reachable()
    said = lines(caplog)
    assert len(said) == 4, said
    assert said[0].startswith("Kafka unreachable at 127.0.0.1:9092: Unable connect to node with id 1"), said[0]
    assert said[1].startswith("Kafka still unreachable at 127.0.0.1:9092 after 30 s"), said[1]
    assert said[2].startswith("Kafka still unreachable at 127.0.0.1:9092 after 60 s"), said[2]
    assert said[3] == "Kafka reachable again at 127.0.0.1:9092 after 70.0 s (4940 client errors meanwhile)"
    assert not health.down and health.episodes == 1


def test_an_acknowledgement_of_a_record_sent_before_the_outage_proves_nothing(
    health: KafkaHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    health.failed("Connection at 127.0.0.1:9092 closed")
    health.reachable(at=clock.now - 0.5)  # a heartbeat sent just before, acknowledged just after
    assert health.down
    clock.now += 3
    health.reachable(at=clock.now - 0.1)  # sent during the outage, acknowledged: Kafka answers
    assert not health.down
    assert [m.split(":")[0] for m in lines(caplog)] == [
        "Kafka unreachable at 127.0.0.1",
        "Kafka reachable again at 127.0.0.1",
    ]


def test_slower_clients_still_reconnecting_do_not_flip_it_back(
    health: KafkaHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    health.failed("Connect call failed")
    clock.now += 10
    health.reachable()
    clock.now += 1
    health.failed("Unable to update metadata from [1]")  # aiokafka reconnects after librdkafka did
    assert not health.down
    clock.now += 10
    health.failed("Connect call failed")  # a new outage
    assert health.down and health.episodes == 2
    assert len(lines(caplog)) == 3


def test_muted_at_start_up_then_said_once_unmuted(
    health: KafkaHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    health.muted = True
    health.failed("Connect to ipv4#127.0.0.1:1 failed: Connection refused")
    health.failed("Connect to ipv4#127.0.0.1:1 failed: Connection refused")
    assert lines(caplog) == []
    health.unmute()
    assert len(lines(caplog)) == 1 and lines(caplog)[0].startswith("Kafka unreachable")
    health.failed("again")
    assert len(lines(caplog)) == 1


# -- the gate ---------------------------------------------------------------------------------


@pytest.fixture
def gated(health: KafkaHealth) -> Iterator[logging.Logger]:
    client = logging.getLogger("test.aiokafka.conn")
    gate = ClientLogGate(health)
    parent = logging.getLogger("test.aiokafka")
    parent.addHandler(gate)
    parent.propagate = False
    try:
        yield client
    finally:
        parent.removeHandler(gate)
        parent.propagate = True


def rdkafka_record(level: int, fac: str, message: str) -> logging.LogRecord:
    """A record as confluent-kafka's `logger` makes it: log(level, "%s [%s] %s", fac, name, buf)."""
    return logging.LogRecord("x", level, __file__, 1, "%s [%s] %s", (fac, "rdkafka#producer-1", message), None)


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_connection_failures_are_counted_and_the_rest_goes_on_to_the_root_handlers(
    gated: logging.Logger, health: KafkaHealth, caplog: pytest.LogCaptureFixture
) -> None:
    """(pytest attaches its own capture handlers to non-propagating loggers too: what reaches
    the root logger's handlers is read from one of ours.)"""
    caplog.set_level(logging.INFO)
    root = Recorder()
    logging.getLogger().addHandler(root)
    try:
        gated.info("Subscribed to topic(s): fanout.events")
        gated.warning("Heartbeat failed for group fanout-worker because it is rebalancing")
        assert not health.down
        for _ in range(50):
            gated.error("Unable connect to node with id 1: [Errno 111] Connect call failed ('127.0.0.1', 9092)")
        gated.warning("Marking the coordinator dead (node 1)for group fanout-worker.")  # while down: counted too
    finally:
        logging.getLogger().removeHandler(root)
    assert [r.getMessage() for r in root.records if r.name == "test.aiokafka.conn"] == [
        "Subscribed to topic(s): fanout.events",
        "Heartbeat failed for group fanout-worker because it is rebalancing",
    ]
    assert health.down and health.errors == 51
    assert [r.getMessage()[:18] for r in root.records if r.name == "test.kafka"] == ["Kafka unreachable "]


def test_librdkafka_records_name_their_failures_by_facility() -> None:
    fail = rdkafka_record(logging.ERROR, "FAIL", "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed")
    down = rdkafka_record(logging.ERROR, "ERROR", "1/1 brokers are down")
    other = rdkafka_record(logging.WARNING, "CONFWARN", "Configuration property x is a consumer property")
    assert is_connection_failure(fail) and is_connection_failure(down)
    assert not is_connection_failure(other)
