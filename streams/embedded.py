"""The embedded projection runner: follows the event store's notification log in-process
(`streams/notification_log.py`) and hands what it reads to the projection host
(`streams/host.py`, the unit of work every runtime shares), on a thread of its own.

eventsourcing 9.5.6's SQLiteApplicationRecorder.subscribe raises NotImplementedError, so this
polls `select_notifications` and is woken by the application after each save. The rebuild
runs it in the caller's thread (`catch_up`), with the log ending at a position (`until`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from eventsourcing.application import Application

from domain.params import Parameters
from domain.review import topics_of
from projections.failures import Throttled, storage_failure
from projections.hosting import PROJECTIONS, Effect, Projection, ViewsTracked, build_projections, topics
from projections.ports import ALL_TARGETS, ViewStore
from streams.host import ProjectionHost
from streams.notification_log import NotificationLog
from streams.records import EventRecord

log = logging.getLogger("fanout.runner")
RETRY_AFTER_FAILURE = 0.5  # seconds between attempts while the projection fails


class EmbeddedRunner:
    def __init__(
        self,
        app: Application[Any],
        views: ViewStore,
        params: Parameters,
        *,
        targets: frozenset[str] = ALL_TARGETS,
        on_effects: Callable[[Sequence[Effect]], None] | None = None,
        batch: int = 500,
        max_entries_per_commit: int = 200_000,
        linger: float = 0.005,
        until: int | None = None,
        before_start: Callable[[], None] | None = None,
    ) -> None:
        """`linger`: seconds the projector waits, once woken from idle, for more of the log
        before it reads (a group commit of the projection; 0: at once). `until`: the log
        ends there (a rebuild). `before_start`: run by start() before the thread (the
        composition root's check of the data dir after a power loss, which may raise)."""
        self.app = app
        self.views = views
        self.params = params
        self.targets = targets
        self.on_effects = on_effects
        self.batch = batch
        self.linger = linger
        self.before_start = before_start
        self.log = NotificationLog(app, topics_of(*topics(build_projections(views, params))), until=until)
        self.host = ProjectionHost(
            views,
            params,
            self.log.to_domain_event,
            self._effects,
            max_entries_per_commit=max_entries_per_commit,
            targets=targets,
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.failure_reason: str | None = None  # storage_full, storage_error, projector_failed
        self.failures = 0  # consecutive failed attempts
        self._reopen_mailbox = False
        self._throttled = Throttled(log)
        # The position the views have committed, kept in memory for backpressure (O(1) reads).
        self.committed = self.position()

    @property
    def processed(self) -> int:
        """Events applied since start."""
        return self.host.stats.applied

    @property
    def entries_written(self) -> int:
        return self.host.stats.entries

    @property
    def projections(self) -> tuple[Projection, ...]:
        return self.host.projections(0)

    # -- lifecycle -----------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self.before_start is not None:
            self.before_start()
        self._thread = threading.Thread(target=self._loop, name="fanout-projector", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._reopen_mailbox:  # RocksDB stays read-only after a failed write until reopened
                    self.views.reopen_mailbox()
                    self._reopen_mailbox = False
                n = self.run_once()
            except Exception as exc:  # keep following; the error is shown by /readyz and refuses writes
                self._failed(exc)
                self._stop.wait(RETRY_AFTER_FAILURE)
                continue
            if self.last_error is not None:
                log.warning("projection recovered after %d failed attempts", self.failures)
                self.last_error = self.failure_reason = None
                self.failures = 0
            if n == 0:
                if self._wake.wait(0.25) and self.linger > 0:
                    # Woken by a save: let the sends behind it join the same unit of work. One
                    # unit per send cost ~650-700 us of CPU a message against ~150 us in bulk
                    # (bench/http_sends.py, ADR-0024); a read-your-write waits this much longer.
                    self._stop.wait(self.linger)
                self._wake.clear()

    def _failed(self, exc: Exception) -> None:
        """One traceback for the first failure, then one line per interval: a full disk
        fails every attempt until an operator frees space."""
        self.failures += 1
        reason = storage_failure(exc)
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.failure_reason = reason or "projector_failed"
        if self.failures == 1:
            log.exception("projection failed (%s); retrying from the tracked position", self.failure_reason)
        else:
            self._throttled("failing", logging.ERROR, "projection still failing: %s", self.last_error)
        # The next attempt starts from the committed views (the host reloads its working sets).
        if reason is not None:
            self._reopen_mailbox = True

    # -- positions -------------------------------------------------------------

    def position(self) -> int:
        """The log position the views hold: every projection commits in the same unit."""
        return self.views.position(PROJECTIONS[0])

    def log_position(self) -> int:
        return self.log.top()

    def wait_until(self, position: int, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._progress:
            while self.position() < position:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._progress.wait(min(left, 0.1))
        return True

    def catch_up(self, progress: Callable[[int], None] | None = None) -> int:
        """Run in the calling thread until the views hold the whole log."""
        total = 0
        while True:
            n = self.run_once()
            if n == 0:
                return total
            total += n
            if progress is not None:
                progress(n)

    # -- the work ----------------------------------------------------------------

    def run_once(self) -> int:
        """One take of the log (up to `batch` events) through the host; returns how many
        events it held. Raises when a unit fails (the next call retries from the views)."""
        start = self.position()
        records = self.log.take(start, self.batch)
        if not records:
            return 0
        self.host.apply_take({0: records})
        with self._progress:
            self._progress.notify_all()
        return sum(isinstance(r, EventRecord) for r in records)

    def _effects(self, effects: Sequence[Effect]) -> None:
        """After each unit commits: the position for backpressure, then the caller's effects."""
        rest: list[Effect] = []
        for e in effects:
            if isinstance(e, ViewsTracked):
                self.committed = max(self.committed, *e.positions.values(), 0)
            else:
                rest.append(e)
        if rest and self.on_effects is not None:
            self.on_effects(rest)
