"""The relay of the distributed runtime (`fanout relay`): the PostgreSQL event store's
notification log into the Kafka event topic, exactly once (`streams/relay.py`, ADR-0013).
`cli/relay.py` loads the settings (`load_settings(role="relay")`: FANOUT_EVENT_STORE and
FANOUT_LOG checked there, the command line's knobs in `Settings.relay`) and calls
`bootstrap_relay`.

An engine that does not answer at start-up is an `EngineUnavailable`; a relay that cannot
go on (fenced by a newer one of the same topic, Kafka refusing its transactions) a
`ProcessFailed` (cli/exits.py says the exit codes)."""

from __future__ import annotations

import logging
from typing import Any

from adapters.postgres.connect import EventStoreUnavailable, check_event_store
from fanout.application import FanoutApplication
from fanout.bootstrap.event_store import postgres_event_store
from fanout.config import EngineUnavailable, ProcessFailed, Settings
from fanout.urls import kafka_settings


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
            raise ProcessFailed(str(exc)) from None

    def stop(self) -> None:
        self.relay.stop()

    def close(self) -> None:
        self.app.close()


def bootstrap_relay(settings: Settings, *, kafka_logger: logging.Logger) -> RelayProcess:
    """The relay of FANOUT_EVENT_STORE into FANOUT_LOG (the event store's tables created if
    absent) with the knobs of `settings.relay`; `kafka_logger` takes librdkafka's own lines."""
    from projections.hosting import folded_topics
    from streams.relay import Relay

    store_env = postgres_event_store(settings.event_store)
    kafka = kafka_settings(settings.log)
    options = settings.relay
    try:
        check_event_store(store_env)  # names the URL and what to do (the pool only says it got no connection)
    except EventStoreUnavailable as exc:
        raise EngineUnavailable(str(exc)) from None
    try:
        app = FanoutApplication(settings.params, {**store_env, "CREATE_TABLE": "y"})
    except Exception as exc:  # the store answered a moment ago: say what it said now
        raise EngineUnavailable(f"cannot open the event store: {type(exc).__name__}: {exc}") from None
    try:
        relay = Relay(
            app,
            kafka,
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
