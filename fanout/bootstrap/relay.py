"""The relay of the distributed runtime (`fanout relay`): the PostgreSQL event store's
notification log into the Kafka event topic, exactly once (`streams/relay.py`, ADR-0013).
`cli/relay.py` parses the command line and calls `bootstrap_relay`.

A failure the operator can fix is a `RelayExit` with the exit code the command
documents: 2 for a bad or missing setting, 1 for an engine that does not answer or a
relay fenced by a newer one of the same topic."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.postgres.connect import EventStoreUnavailable, check_event_store
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap.event_store import postgres_event_store
from fanout.urls import UrlError, kafka_settings


class RelayExit(RuntimeError):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RelayOptions:
    """The command line's knobs (`fanout relay --help`)."""

    batch: int = 500
    commit_interval: float = 0.02  # seconds
    log_interval: float = 5.0
    transactional_id: str | None = None


def _setting(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        example = "postgresql://user@host:5432/dbname" if name == "FANOUT_EVENT_STORE" else "kafka://host:9092"
        raise RelayExit(f"{name} is not set; the relay needs it, e.g. {name}={example}", 2)
    return value


class RelayProcess:
    """A built relay: `run()` until `stop()`, then `close()` (always)."""

    def __init__(self, app: FanoutApplication, relay: Any) -> None:
        self.app = app
        self.relay = relay

    def run(self) -> None:
        from streams.relay import RelayError

        try:
            self.relay.run()
        except RelayError as exc:
            raise RelayExit(str(exc), 1) from None

    def stop(self) -> None:
        self.relay.stop()

    def close(self) -> None:
        self.app.close()


def bootstrap_relay(env: Mapping[str, str], options: RelayOptions, *, kafka_logger: logging.Logger) -> RelayProcess:
    """The relay of FANOUT_EVENT_STORE into FANOUT_LOG (the event store's tables created if
    absent); `kafka_logger` takes librdkafka's own lines."""
    from projections.hosting import folded_topics
    from streams.relay import Relay

    if options.batch < 1:
        raise RelayExit("--batch must be at least 1", 2)
    if not options.commit_interval >= 0:
        raise RelayExit("--commit-interval-ms must be 0 or more", 2)
    try:
        store_env = postgres_event_store(_setting(env, "FANOUT_EVENT_STORE"))
        kafka = kafka_settings(_setting(env, "FANOUT_LOG"))
    except UrlError as exc:
        raise RelayExit(str(exc), 2) from None
    try:
        check_event_store(store_env)  # names the URL and what to do (the pool only says it got no connection)
    except EventStoreUnavailable as exc:
        raise RelayExit(str(exc), 1) from None
    try:
        app = FanoutApplication(Parameters(), {**store_env, "CREATE_TABLE": "y"})
    except Exception as exc:  # the store answered a moment ago: say what it said now
        raise RelayExit(f"cannot open the event store: {type(exc).__name__}: {exc}", 1) from None
    try:
        relay = Relay(
            app,
            brokers=kafka.brokers,
            topic=kafka.topic,
            partitions=kafka.partitions,
            replication=kafka.replication,
            min_insync=kafka.min_insync,
            transactional_id=options.transactional_id,
            batch=options.batch,
            commit_interval=options.commit_interval,
            log_interval=options.log_interval,
            kafka_logger=kafka_logger,
            relayed_topics=folded_topics(),  # what the workers' projections fold (ADR-0034)
        )
    except BaseException:
        app.close()
        raise
    return RelayProcess(app, relay)
