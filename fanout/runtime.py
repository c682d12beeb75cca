"""The composition root of the embedded runtime: event store (eventsourcing's
SQLite recorder), views (SQLite), the projection runner and the push hub.
Everything is built here and handed to the API and the CLI; tests pass overrides."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from adapters.sqlite_views import SqliteViews
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.overload import Backpressure
from fanout.push import PushHub
from fanout.queries import Queries
from projections.capacity import CapacityProjection
from projections.delivery import Delivered
from projections.hosting import Effect
from streams.embedded import EmbeddedRunner

log = logging.getLogger("fanout.runtime")


class DataDirBusy(RuntimeError):
    pass


class DataDirLock:
    """One writer process per data dir (serve, rebuild): an exclusive flock."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "fanout.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirBusy(
                f"{self.path.parent} is in use by another fanout process (serve or rebuild); stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def event_store_env(data_dir: Path) -> dict[str, str]:
    return {
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "SQLITE_DBNAME": str(data_dir / "events.sqlite"),
        "SQLITE_LOCK_TIMEOUT": "30",
    }


class EmbeddedRuntime:
    def __init__(
        self,
        data_dir: Path | str,
        params: Parameters | None = None,
        *,
        clock: Callable[[], float] = time.time,
        lock: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.params = params or Parameters()
        self.clock = clock
        self._lock = DataDirLock(self.data_dir) if lock else None
        if self._lock is not None:
            self._lock.acquire()
        try:
            self.views = SqliteViews(self.data_dir, shards=self.params.mailbox_shards)
            self.app = FanoutApplication(
                self.params,
                event_store_env(self.data_dir),
                clock=clock,
                message_sender=self._message_sender,
                conversations_in_scope=self._conversations_in_scope,
                read_state=self._read_state,
            )
            self.queries = Queries(self.views, self.params)
            self.hub = PushHub(self.views)
            self.runner = EmbeddedRunner(
                self.app,
                self.views,
                self.params,
                on_effects=self._on_effects,
            )
            self.app.saved_listeners.append(self.runner.wake)
            self.backpressure = Backpressure(
                self.runner,
                self.runner.log_position(),
                max_events=self.params.max_projection_lag_events,
                max_entries=self.params.max_projection_lag_entries,
            )
            self.app.recorded_listeners.append(self.backpressure.recorded)
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise
        self.review_triggers = 0
        self.started_at = time.time()

    # -- wiring ----------------------------------------------------------------

    def _message_sender(self, tenant: str, conversation_id: str, seq: int) -> str | None:
        m = self.views.message(tenant, conversation_id, seq)
        if m is None and self.runner.running:
            self.runner.wait_until(self.runner.log_position(), timeout=10)
            m = self.views.message(tenant, conversation_id, seq)
        return m["sender"] if m else None

    def _conversations_in_scope(self, tenant: str, size_bucket: str) -> list[str]:
        if self.runner.running:
            self.runner.wait_until(self.runner.log_position(), timeout=30)
        return self.views.heads_by_scope(tenant, size_bucket)

    def _read_state(self, tenant: str, conversation_id: str, user_id: str) -> tuple[int, int] | None:
        """(read_seq, views position) of a member: the position is read after the state,
        so the views at that position hold at least that read seq."""
        state = self.views.state(tenant, user_id, conversation_id)
        return None if state is None else (int(state["read_conversation_seq"]), self.runner.position())

    def capacity(self) -> CapacityProjection:
        """The live capacity window (T1/T2), as the projector keeps it."""
        return next(p for p in self.runner.projections if isinstance(p, CapacityProjection))

    def _on_effects(self, effects: Sequence[Effect]) -> None:
        """After a unit of work commits: online pushes (invariant O), and the reviews
        T1/T2 open (ADR decision 3: a trigger only opens one; a person decides)."""
        for effect in effects:
            try:
                if isinstance(effect, Delivered):
                    pushes = self.hub.deliver(effect)
                    self.views.record_pushes(effect.tenant, effect.conversation_id, effect.seq, pushes)
                else:
                    t = effect
                    self.app.open_review(
                        t.tenant, t.size_bucket, t.trigger, t.details, "capacity-monitor", review_key=t.review_key
                    )
                    self.review_triggers += 1
            except Exception:
                log.exception("could not act on %s (the views are committed)", type(effect).__name__)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> EmbeddedRuntime:
        self.runner.start()
        return self

    def wait_projected(self, timeout: float = 30.0) -> bool:
        """Block until the views hold every event written so far."""
        return self.runner.wait_until(self.runner.log_position(), timeout)

    def close(self) -> None:
        self.runner.stop()
        self.hub.close()
        self.views.close()
        self.app.close()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> EmbeddedRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

