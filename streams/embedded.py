"""The embedded projection runner: follows the event store's notification log
in-process, with tracking, and hosts the projections.

eventsourcing 9.5.6's SQLiteApplicationRecorder.subscribe raises
NotImplementedError, so this polls `select_notifications` and is woken by the
application after each save."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from eventsourcing.application import Application
from eventsourcing.persistence import Notification

from domain.params import Parameters
from domain.review import topics_of
from projections.failures import Throttled, storage_failure
from projections.hosting import PROJECTIONS, Effect, Projection, build_projections, topics
from projections.ports import ALL_PARTS, ViewStore

log = logging.getLogger("fanout.runner")
RETRY_AFTER_FAILURE = 0.5  # seconds between attempts while the projection fails


class EmbeddedRunner:
    def __init__(
        self,
        app: Application[Any],
        views: ViewStore,
        params: Parameters,
        *,
        parts: frozenset[str] = ALL_PARTS,
        on_effects: Callable[[Sequence[Effect]], None] | None = None,
        batch: int = 500,
        max_entries_per_commit: int = 200_000,
        linger: float = 0.005,
    ) -> None:
        """`linger`: seconds the projector waits, once woken from idle, for more of the log
        before it reads (a group commit of the projection; 0: at once)."""
        self.app = app
        self.views = views
        self.params = params
        self.parts = parts
        self.on_effects = on_effects
        self.reset()
        self.batch = batch
        self.max_entries_per_commit = max_entries_per_commit
        self.linger = linger
        self.topics = topics_of(*topics(self.projections))
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
        self.processed = 0
        self.entries_written = 0

    # -- lifecycle -----------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
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
        # The next attempt starts from the committed views (_commit reloaded the working sets).
        if reason is not None:
            self._reopen_mailbox = True

    def reset(self) -> None:
        """Forget in-memory working state; it is reloaded from the committed views."""
        self.projections = build_projections(self.views, self.params)
        self._routes: dict[type, tuple[Projection, ...]] = {
            t: tuple(p for p in self.projections if t in p.topics) for t in topics(self.projections)
        }

    # -- positions -------------------------------------------------------------

    def position(self) -> int:
        """The log position the views hold: every projection commits in the same unit."""
        return self.views.position(PROJECTIONS[0])

    def log_position(self) -> int:
        return self.app.recorder.max_notification_id() or 0

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
        start = self.position()
        top = self.log_position()
        if top <= start:
            return 0
        notes = self.app.recorder.select_notifications(
            start=start, limit=self.batch, stop=top, topics=self.topics, inclusive_of_start=False
        )
        # Fewer than a batch means every notification up to `top` was read: the ones not
        # returned are not ours (e.g. quota charges), and the last commit may track `top`.
        through = top if len(notes) < self.batch else None
        if not notes:
            with self.views.unit_of_work(self.parts) as w:
                for p in self.projections:
                    w.track(p.name, top)
            self.committed = top
        done = 0
        while done < len(notes):
            done += self._commit(notes[done:], through)
            self.committed = through if through is not None and done == len(notes) else notes[done - 1].id
        with self._progress:
            self._progress.notify_all()
        return len(notes)

    def _commit(self, notes: Sequence[Notification], through: int | None = None) -> int:
        """Apply notifications in one unit of work; returns how many were applied.
        When all of them fit and `through` is given, the position recorded is `through`.
        The effects are acted on only after the commit (invariant O)."""
        effects: list[Effect] = []
        count = 0
        try:
            with self.views.unit_of_work(self.parts) as w:
                for note in notes:
                    event = self.app.mapper.to_domain_event(note)
                    for p in self._routes.get(type(event), ()):
                        effects.extend(p.process(event, note.id, w))
                    count += 1
                    if w.mailbox_entries >= self.max_entries_per_commit:
                        break
                last = through if through is not None and count == len(notes) else notes[count - 1].id
                for p in self.projections:
                    p.flush(w)
                    w.track(p.name, last)
                entries = w.mailbox_entries
        except BaseException:
            # The working sets ran ahead of what committed: reload them from the views.
            self.reset()
            raise
        self.processed += count
        self.entries_written += entries
        if effects and self.on_effects is not None:
            try:
                self.on_effects(effects)
            except Exception:
                log.exception("acting on the effects failed (the views are committed)")
        return count
