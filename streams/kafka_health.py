"""Kafka's reachability as one process reports it: one line, not a flood.

While Kafka is down its clients log every failed attempt: aiokafka (the worker's Faust
consumer) about 76 ERROR lines a second, librdkafka (the pushes' consumer and the position
consumer of a replica, the heartbeat producer of a worker) about 19. `KafkaHealth` turns them
into a state and says it once:

    Kafka unreachable at HOST:PORT: <the first error> (retrying; ...)
    Kafka still unreachable at HOST:PORT after 30 s (N client errors, the last: ...)   every 30 s
    Kafka reachable again at HOST:PORT after 12.3 s (N client errors meanwhile)

It hears of failures from the clients' log records, which `gate_client_logs` routes through
one handler: a record about a connection failing (or any WARNING+ of theirs while Kafka is
down) is counted, not printed; every other record goes on to the root logger's handlers as
before. It hears of success from the process: a heartbeat sent after the outage began and
acknowledged (worker), a relayed position read back (replica). After Kafka comes back, a client that is slower to reconnect
than the one that said so may log a few more failures: they are counted for `GRACE` seconds
without calling Kafka unreachable again.

One instance per process (`process_health`): the clients' loggers are process-wide."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from projections.failures import first_line

log = logging.getLogger("fanout.kafka")

SUMMARY_EVERY = 30.0  # seconds between "still unreachable" lines
GRACE = 5.0  # seconds after "reachable again" during which client failures do not flip it back
# The loggers of the Kafka clients: aiokafka's (Faust), and the librdkafka clients' of
# streams/pushes.py and streams/relay.py (their `logger` config).
CLIENT_LOGGERS = ("aiokafka", "fanout.pushes.rdkafka", "fanout.relay.rdkafka", "fanout.kafka.rdkafka")
_CONNECTION_WORDS = (
    "connect",
    "not ready",
    "nodenotready",
    "unable to update metadata",
    "unable to bootstrap",
    "brokers are down",
    "disconnected",
    "timed out",
    "transport",
    "failed to resolve",
)


class KafkaHealth:
    """Reachable or not, with the lines that say so (see the module doc). Thread-safe."""

    def __init__(
        self,
        where: str,
        *,
        logger: logging.Logger = log,
        summary_every: float = SUMMARY_EVERY,
        grace: float = GRACE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.where = where
        self.log = logger
        self.summary_every = summary_every
        self.grace = grace
        self.clock = clock
        self.muted = False  # start-up: the command reports a failure in its own one line
        self.down_since: float | None = None
        self.errors = 0  # client errors counted in the current (or last) episode
        self.episodes = 0  # times Kafka became unreachable
        self.last_error: str | None = None
        self._next_summary = 0.0
        self._up_at = float("-inf")  # when it was last found reachable again
        self._announced = False  # the "unreachable" line of the current episode was written
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, what: str) -> None:
        """A client could not reach Kafka (or something said it is down)."""
        with self._lock:
            now = self.clock()
            self.last_error = what = first_line(what)
            if self.down_since is None:
                if now - self._up_at < self.grace:
                    self.errors += 1  # a slower client still reconnecting
                    return
                self.down_since, self.errors, self.episodes = now, 1, self.episodes + 1
                self._next_summary = now + self.summary_every
                self._announced = False
                self._announce()
                return
            self.errors += 1
            if not self._announced:
                self._announce()
            elif now >= self._next_summary and not self.muted:
                self._next_summary = now + self.summary_every
                self.log.error(
                    "Kafka still unreachable at %s after %.0f s (%d client errors, the last: %s)",
                    self.where,
                    now - self.down_since,
                    self.errors,
                    what,
                )

    def _announce(self) -> None:
        if self.muted:
            return
        self._announced = True
        self.log.error(
            "Kafka unreachable at %s: %s (retrying; its clients' errors are summarised every %.0f s)",
            self.where,
            self.last_error,
            self.summary_every,
        )

    def reachable(self, at: float | None = None) -> None:
        """Something reached Kafka: now, or at `at` (the clock's time; a record acknowledged
        now may have been sent before the outage began: then it proves nothing)."""
        with self._lock:
            if self.down_since is None or (at is not None and at <= self.down_since):
                return
            now = self.clock()
            took, self.down_since, self._up_at = now - self.down_since, None, now
            if self._announced and not self.muted:
                self.log.warning(
                    "Kafka reachable again at %s after %.1f s (%d client errors meanwhile)",
                    self.where,
                    took,
                    self.errors,
                )
            self.errors = 0

    def unmute(self) -> None:
        """Start-up is over: from now on the state changes are logged (an outage already
        under way is said now)."""
        with self._lock:
            self.muted = False
            if self.down_since is not None and not self._announced:
                self._announce()


def is_connection_failure(record: logging.LogRecord) -> bool:
    """A client's record saying it could not reach a broker. librdkafka's records (through
    confluent-kafka's `logger`) carry their facility first: FAIL is a connection failure."""
    if record.args and isinstance(record.args, tuple) and record.args[0] == "FAIL":
        return True
    text = record.getMessage().lower()
    return any(word in text for word in _CONNECTION_WORDS)


class ClientLogGate(logging.Handler):
    """The one handler of the Kafka clients' loggers (they no longer propagate): failures go
    to `health`, the rest to the root logger's handlers, whatever they are by then (Faust
    installs its own at start)."""

    def __init__(self, health: KafkaHealth) -> None:
        super().__init__(logging.NOTSET)
        self.health = health

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= logging.INFO and (
                is_connection_failure(record) or (self.health.down and record.levelno >= logging.WARNING)
            ):
                self.health.failed(record.getMessage())
                return
        except Exception:
            self.handleError(record)
            return
        logging.getLogger().handle(record)


_process: KafkaHealth | None = None
_process_lock = threading.Lock()


def process_health(where: str, loggers: Iterable[str] = CLIENT_LOGGERS) -> KafkaHealth:
    """This process's KafkaHealth (created by the first caller, naming its brokers
    servers), with the clients' loggers routed through its gate."""
    global _process
    with _process_lock:
        if _process is None:
            _process = KafkaHealth(where)
            gate = ClientLogGate(_process)
            for name in loggers:
                client = logging.getLogger(name)
                client.addHandler(gate)
                client.propagate = False
        return _process
