"""The relay: follows the PostgreSQL event store's notification log and publishes every
event to one Kafka topic, exactly once as a read_committed consumer sees it, even when
killed with SIGKILL at any point (docs/adr/0013-relay-and-watermarks.md). Given
`relayed_topics` (the root gives the topics some projection folds), it publishes only the
events of those topics: the others (a tenant quota's `Charged`, one per send) are no one's
on the topic, and their positions are covered by the watermarks all the same (ADR-0034).

How:

* the log is followed with the recorder's LISTEN/NOTIFY subscription (`subscribe(gt=...)`,
  eventsourcing 9.5.6 `PostgresSubscription`), with its start window closed (`_Subscription`);
* notifications are relayed in batches, one Kafka transaction per batch, by a transactional
  producer whose transactional.id is fixed per topic (`fanout-relay.<topic>`); the batches
  are group-committed (ADR-0023): a transaction begins at most every `commit_interval`
  seconds (or at once when `batch` notifications are waiting) and takes everything that
  queued since the previous one began, so a steady trickle of sends costs one transaction
  (and one set of watermarks) per interval, while a lone send after a quiet spell is
  relayed at once;
* every record carries its log position (streams/records.py), and each transaction ends
  with a Watermark(last position) record on EVERY partition; the position the relay has
  reached is therefore committed atomically with the records themselves: there is no
  offset store to disagree with the topic;
* every record is keyed by the routing rule (streams/routing.py `RoutingKeys`): a
  conversation's events and its members' reads land in one partition, in log order;
* on start, `init_transactions()` fences any previous instance and aborts its open
  transaction; then the relayed position is read back from the topic with a
  read_committed consumer (streams/positions.py `relayed_position`) and the subscription
  starts after it.

A kill at any moment leaves either a committed transaction (its records and its position
are in the topic: the next instance starts after them) or an aborted one (invisible to
read_committed consumers, and its position is not in the topic: the next instance sends
those events again). Nothing is lost, nothing is duplicated.

This module is the relay only: the routing rule is streams/routing.py, the position read
streams/positions.py, the topic's creation streams/kafka.py. It imports streams/ only; the
caller builds the application (fanout.application.FanoutApplication) on the PostgreSQL
recorder and hands it in.

Why this module is long: one class, the relay, whose exactly-once argument (the docstring above)
spans its start (position read back), its batching and its transaction: read together or not at
all. Its neighbours took the rest (routing.py, positions.py, kafka.py)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from eventsourcing.application import Application
from eventsourcing.persistence import Notification
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresSubscription
from psycopg.sql import SQL, Identifier

from projections import failpoints
from streams.kafka import KafkaSettings, TopicUnavailable, ensure_event_topic, kafka_error
from streams.positions import PositionUnreadable, relayed_position
from streams.records import MAX_RECORD_BYTES, EventRecord, Watermark
from streams.routing import PARTITIONER, RoutingKeys, as_uuid

log = logging.getLogger("fanout.relay")
# librdkafka's own log lines (a broker down: one line per reconnect attempt) go here, not to stderr.
rdkafka_log = logging.getLogger("fanout.relay.rdkafka")

_FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTION_COORDINATOR_FENCED,
    }
)
_END = object()
PRODUCER_LINGER_MS = 5
Headers = list[tuple[str, str | bytes | None]]  # what Producer.produce takes


class RelayError(RuntimeError):
    """The relay cannot go on (an engine unreachable, a record Kafka refuses...)."""


class RelayFenced(RelayError):
    """Another relay instance with the same transactional id started: this one must stop."""


def transactional_id_for(topic: str) -> str:
    return f"fanout-relay.{topic}"


# -- the subscription -----------------------------------------------------------------------


class _Subscription(PostgresSubscription):
    """eventsourcing's PostgresSubscription with its start window closed.

    PostgresSubscription starts two threads at once: the pull thread selects the
    notifications after `gt` at once, while the listen thread connects and runs LISTEN.
    A commit between that first select and the LISTEN sends its NOTIFY to nobody, so the
    pull thread sleeps until the NEXT commit wakes it: on a quiet log those events would
    not be relayed (tests/distributed/test_relay.py shows it with the plain class).
    Here the listen thread wakes the pull thread once more right after LISTEN has run
    (the connection is in autocommit: LISTEN is in effect when execute returns). Any
    commit before that is seen by the select this wake-up causes; any commit after it
    NOTIFYs this listener."""

    def __init__(self, recorder: PostgresApplicationRecorder, gt: int | None = None) -> None:
        self.listening = threading.Event()
        super().__init__(recorder=recorder, gt=gt)

    def _listen(self) -> None:  # eventsourcing 9.5.6's body, plus the wake-up after LISTEN
        try:
            with self._recorder.datastore.get_connection() as conn:
                conn.execute(SQL("LISTEN {0}").format(Identifier(self._recorder.channel_name)))
                self.listening.set()
                self._has_been_notified.set()
                while not self._has_been_stopped and not self._thread_error:
                    for _ in conn.notifies(timeout=0.1, stop_after=1):
                        self._has_been_notified.set()
        except BaseException as e:
            if self._thread_error is None:
                self._thread_error = e
            self.stop()


# -- Kafka helpers ----------------------------------------------------------------------------


def _is_fenced(err: KafkaError | None) -> bool:
    return err is not None and (err.code() in _FENCED_CODES or "fenced" in str(err).lower())


# -- the relay ----------------------------------------------------------------------------------


@dataclass
class RelayStats:
    position: int = 0  # the last position committed to Kafka by this process (or found at start)
    events: int = 0  # events relayed by this process
    transactions: int = 0
    aborted: int = 0  # transactions aborted and retried
    started_at: float = 0.0
    left_out: int = 0  # events of topics not relayed (`relayed_topics`), positions covered by the watermarks
    # The longest a batch's first notification was held in the relay (taken from the
    # subscription -> its transaction began): at most about `commit_interval`.
    longest_hold: float = 0.0


class Relay:
    """Follows `app`'s notification log (a PostgreSQL application recorder) and publishes
    it to `topic` at `brokers`. `start()` prepares (topic, producer, position); `run()`
    relays until `stop()` (thread- and signal-handler-safe) or an error."""

    def __init__(
        self,
        app: Application[Any],
        kafka: KafkaSettings,
        *,
        transactional_id: str | None = None,
        batch: int,
        commit_interval: float,
        log_interval: float,
        transaction_timeout: float = 60.0,
        kafka_logger: logging.Logger | None = None,
        relayed_topics: frozenset[str] | None = None,
    ) -> None:
        """`kafka`: FANOUT_LOG (the brokers, the event topic, what it is created with);
        `batch`, `commit_interval` and `log_interval` are `fanout relay`'s knobs (their
        defaults: fanout/config.py RelayOptions); `relayed_topics`: publish only the events of
        these stored topics (None: every event)."""
        if not isinstance(app.recorder, PostgresApplicationRecorder):
            raise TypeError(
                f"the relay follows a PostgreSQL event store; this application has {type(app.recorder).__name__}"
            )
        if batch < 1:
            raise ValueError("batch must be at least 1")
        if commit_interval < 0:
            raise ValueError("commit_interval must not be negative")
        self.app = app
        self.recorder: PostgresApplicationRecorder = app.recorder
        self.kafka = kafka
        self.brokers = kafka.brokers
        self.topic = kafka.topic
        self.partitions = kafka.partitions  # the topic's own count once start() ensured it
        self.transactional_id = transactional_id or transactional_id_for(kafka.topic)
        self.batch = batch
        self.commit_interval = commit_interval
        # when the last transaction began (monotonic): the next begins commit_interval later at the earliest
        self._began = float("-inf")
        self.log_interval = log_interval
        self.transaction_timeout = transaction_timeout
        self.kafka_logger = kafka_logger or rdkafka_log
        self.keys = RoutingKeys(app)
        self.relayed_topics = relayed_topics
        self.stats = RelayStats()
        self._producer: Producer | None = None
        self._fatal: KafkaError | None = None  # the producer's fatal error, as its error_cb told it
        self._subscription: _Subscription | None = None
        self._stop = threading.Event()
        self._started = False
        self.on_committed: Callable[[int], None] | None = None  # called with each committed position

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def position(self) -> int:
        return self.stats.position

    def start(self) -> int:
        """Create the topic if missing, take over the transactional id (fencing a previous
        instance, aborting its open transaction), and find the relayed position."""
        try:
            self.partitions = ensure_event_topic(self.kafka, logger=rdkafka_log)
        except TopicUnavailable as exc:
            raise RelayError(str(exc)) from None
        producer = Producer(
            {
                "bootstrap.servers": self.brokers,
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                # where a key lands (streams/routing.py): the replicas' per-conversation fresh reads rely on it
                "partitioner": PARTITIONER,
                # commit_transaction flushes whatever linger holds: this only batches the
                # produce calls of one transaction into few requests.
                "linger.ms": PRODUCER_LINGER_MS,
                "compression.type": "lz4",
                "message.max.bytes": MAX_RECORD_BYTES + 1024 * 1024,
                "transaction.timeout.ms": int(self.transaction_timeout * 1000),
                "socket.connection.setup.timeout.ms": 10_000,
                "logger": self.kafka_logger,
                "error_cb": self._on_error,
            }
        )
        t0 = time.monotonic()
        try:
            producer.init_transactions(self.transaction_timeout)
        except KafkaException as exc:
            raise RelayError(f"init_transactions({self.transactional_id!r}) failed at {self.brokers}: {exc}") from None
        self._producer = producer
        try:
            self.stats.position = relayed_position(self.brokers, self.topic)
        except PositionUnreadable as exc:
            raise RelayError(str(exc)) from None
        self.stats.started_at = time.time()
        self._started = True
        log.info(
            "relay: %s -> kafka %s topic %s (%d partitions), transactional id %s (took over in %.2fs); "
            "relayed position %d, log at %d",
            self.recorder.channel_name,
            self.brokers,
            self.topic,
            self.partitions,
            self.transactional_id,
            time.monotonic() - t0,
            self.stats.position,
            self._log_top(),
        )
        return self.stats.position

    def stop(self) -> None:
        """Ask `run()` to return: the transaction in progress is finished (committed), the
        subscription closed. Safe from a signal handler and from another thread."""
        self._stop.set()
        sub = self._subscription
        if sub is not None:
            sub.stop()

    def run(self) -> None:
        if not self._started:
            self.start()
        assert self._producer is not None
        inbox: queue.Queue[Any] = queue.Queue(maxsize=self.batch * 4)
        with _Subscription(self.recorder, gt=self.stats.position) as sub:
            self._subscription = sub
            if self._stop.is_set():
                sub.stop()
            feeder = threading.Thread(target=self._feed, args=(sub, inbox), name="fanout-relay-feed", daemon=True)
            feeder.start()
            try:
                self._loop(inbox)
            finally:
                sub.stop()
                self._subscription = None
                feeder.join(5)
        self._close()

    def _close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
        log.info(
            "relay: stopped at position %d (%d events in %d transactions this run)",
            self.stats.position,
            self.stats.events,
            self.stats.transactions,
        )

    def _feed(self, sub: _Subscription, inbox: queue.Queue[Any]) -> None:
        """Move notifications from the subscription into `inbox` (so the loop can batch with
        a timeout); ends with (_END, error or None)."""
        error: BaseException | None = None
        try:
            for note in sub:
                while not self._stop.is_set():
                    try:
                        inbox.put(note, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    break
        except BaseException as exc:
            error = exc
        while True:
            try:
                inbox.put((_END, error), timeout=0.2)
                return
            except queue.Full:
                if self._stop.is_set():
                    return

    def _loop(self, inbox: queue.Queue[Any]) -> None:
        last_log = time.monotonic()
        logged_events = -1
        while not self._stop.is_set():
            notes, end = self._take(inbox)
            if notes:
                self._relay(notes)
            now = time.monotonic()
            if now - last_log >= self.log_interval and logged_events != self.stats.events:
                self._log_progress()
                last_log, logged_events = now, self.stats.events
            if end is not None:
                error = end[1]
                if error is not None and not self._stop.is_set():
                    raise RelayError(f"the event store subscription failed: {error!r}") from error
                return
        self._log_progress()

    def _take(self, inbox: queue.Queue[Any]) -> tuple[list[Notification], tuple[object, BaseException | None] | None]:
        """The next batch (group commit, ADR-0023): block for a first notification, then
        take everything queued until `commit_interval` after the previous transaction
        began, or until `batch` notifications. After a quiet spell the interval is over
        already: a lone notification goes at once. Under load a transaction begins every
        interval with what queued while the previous one was committing."""
        notes: list[Notification] = []
        try:
            item = inbox.get(timeout=0.5)
        except queue.Empty:
            return notes, None
        taken = time.monotonic()
        deadline = self._began + self.commit_interval
        while True:
            if isinstance(item, tuple):
                return self._held(notes, taken), item
            notes.append(item)
            if len(notes) >= self.batch:
                return self._held(notes, taken), None
            item = None
            while item is None:
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stop.is_set():
                        return self._held(notes, taken), None
                    with suppress(queue.Empty):
                        item = inbox.get(timeout=min(left, 0.5))

    def _held(self, notes: list[Notification], taken: float) -> list[Notification]:
        if notes:
            self.stats.longest_hold = max(self.stats.longest_hold, time.monotonic() - taken)
        return notes

    # -- one transaction -------------------------------------------------------------------

    def _relay(self, notes: Sequence[Notification]) -> None:
        """One transaction: the events (of `relayed_topics`), then Watermark(last) on every
        partition, commit; `last` is the last notification taken, relayed or not, so the
        watermarks cover the positions left out. An abortable failure aborts and retries the
        same notifications; a fenced producer raises RelayFenced; other fatal errors raise
        RelayError."""
        p = self._producer
        assert p is not None
        relayed = self.relayed_topics
        records = [(self.keys.key(n), n) for n in notes if relayed is None or n.topic in relayed]
        last = notes[-1].id
        watermark: Headers = [*Watermark(last).headers()]
        labels = {n.topic.rsplit(".", 1)[-1] for _, n in records}  # the failpoints' labels: MessageSent, ...
        attempt = 0
        while True:
            attempt += 1
            try:
                self._began = time.monotonic()
                p.begin_transaction()
                for key, n in records:
                    rec = EventRecord(n.id, n.topic, as_uuid(n.originator_id), n.originator_version, n.state)
                    self._produce(p, value=n.state, key=key, headers=[*rec.headers()])
                for k in range(self.partitions):
                    self._produce(p, value=b"", partition=k, headers=watermark)
                failpoints.hit("relay.produced", labels)  # produced, not committed (the crash tests)
                self._commit(p)
                break
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None or _is_fenced(err) or not err.txn_requires_abort() or attempt >= 5:
                    raise self._failure(exc, notes) from None
                log.warning("relay: transaction aborted (%s); retrying %d events", err, len(records))
                self.stats.aborted += 1
                try:
                    p.abort_transaction(self.transaction_timeout)
                except KafkaException as again:
                    raise self._failure(again, notes) from None
                time.sleep(0.2 * attempt)
        p.poll(0)
        self.stats.position = last
        self.stats.events += len(records)
        self.stats.left_out += len(notes) - len(records)
        self.stats.transactions += 1
        if self.on_committed is not None:
            self.on_committed(last)

    def _on_error(self, err: KafkaError) -> None:
        """The producer's error callback (served by poll): a fatal error is kept, since a call
        after it fails with the generic _FATAL ("Local: Fatal error"), and the underlying one
        (the client translates it for this callback) says whether the producer was fenced."""
        if err.fatal():
            self._fatal = err

    def _failure(self, exc: KafkaException, notes: Sequence[Notification]) -> RelayError:
        err = kafka_error(exc)
        if err is not None and err.code() == KafkaError._FATAL and self._producer is not None:
            self._producer.poll(0)  # serve the error callback: the underlying fatal error
            err = self._fatal or err
        if _is_fenced(err):
            return RelayFenced(
                f"fenced: another relay took over transactional id {self.transactional_id!r} "
                f"(this one stops at position {self.stats.position}): {err}"
            )
        return RelayError(f"Kafka refused the transaction of positions {notes[0].id}..{notes[-1].id}: {err or exc}")

    def _produce(
        self, p: Producer, *, value: bytes, headers: Headers, key: str | None = None, partition: int = -1
    ) -> None:
        while True:
            try:
                p.produce(self.topic, value=value, key=key, partition=partition, headers=headers)
                return
            except BufferError:  # the local queue is full: let deliveries drain
                p.poll(0.1)

    def _commit(self, p: Producer) -> None:
        for attempt in range(1, 6):
            try:
                p.commit_transaction(self.transaction_timeout)
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None or not err.retriable() or _is_fenced(err) or attempt == 5:
                    raise
                log.warning("relay: commit failed (%s), retrying", err)
                time.sleep(0.2 * attempt)

    # -- observability ---------------------------------------------------------------------

    def _log_top(self) -> int:
        try:
            return int(self.recorder.max_notification_id() or 0)
        except Exception:  # a log line must not stop the relay
            return -1

    def lag(self) -> int:
        """Log positions not relayed yet: max notification id - relayed position."""
        return max(0, self._log_top() - self.stats.position)

    def _log_progress(self) -> None:
        elapsed = max(1e-9, time.time() - self.stats.started_at)
        log.info(
            "relay: %d events in %d transactions (%.0f/s), %d left out (no projection folds them), position %d, lag %d",
            self.stats.events,
            self.stats.transactions,
            self.stats.events / elapsed,
            self.stats.left_out,
            self.stats.position,
            self.lag(),
        )
