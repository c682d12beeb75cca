"""The embedded runtime: one process over one data dir, the command side, the views, the
in-process projection runner (`streams/embedded.py`, the shared host of `streams/host.py`) and
the push hub. Implements `fanout.runtime.Runtime` as `fanout/distributed.py` does for the
distributed runtime; built by the composition root (`fanout/bootstrap/embedded.py` `bootstrap`), which
picks its adapters, builds its parts (the application, the runner, the hub, the backpressure,
the effect handlers) and hands them in."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self

from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.clock_guard import ClockGuard
from fanout.effects import Count
from fanout.overload import Backpressure
from fanout.push import PushHub
from fanout.queries import Queries
from fanout.rereview import MailboxMeter
from projections.capacity import CapacityProjection
from projections.head_cache import HeadCache
from projections.hosting import PROJECTIONS
from projections.ports import ViewStore

log = logging.getLogger("fanout.runtime")


class Releasable(Protocol):
    """The data dir's lock (fanout/bootstrap/embedded.py DataDirLock), released at close."""

    def release(self) -> None: ...


class Projector(Protocol):
    """The in-process projection runner the composition root hands in (streams/embedded.py
    EmbeddedRunner): what the runtime, its backpressure and /readyz read of it."""

    committed: int
    last_error: str | None
    failure_reason: str | None

    @property
    def running(self) -> bool: ...

    @property
    def projections(self) -> tuple[Any, ...]: ...

    def wake(self) -> None: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def position(self) -> int: ...

    def log_position(self) -> int: ...

    def wait_until(self, position: int, timeout: float = 30.0) -> bool: ...

    def catch_up(self, progress: Callable[[int], None] | None = None) -> int: ...


class EmbeddedRuntime:
    """One process: the command side, the views, the in-process projection runner and
    the push hub over one data dir. Implements `fanout.runtime.Runtime`; built by
    `bootstrap`, which builds its parts and hands them in."""

    head_cache: HeadCache | None = None  # one SQLite statement answers the login: nothing to keep (ADR-0035)
    clock_guard: ClockGuard | None = None  # one process stamps every send: its clock agrees with itself (ADR-0041)

    def __init__(
        self,
        data_dir: Path,
        params: Parameters,
        views: ViewStore,
        app: FanoutApplication,
        runner: Projector,
        *,
        queries: Queries,
        hub: PushHub,
        backpressure: Backpressure,
        reviews_opened: Count,
        lock: Releasable | None = None,
        meter: MailboxMeter | None = None,
    ) -> None:
        """`app` reads the views through `ViewReads` and wakes `runner` after each save;
        `runner` acts on each committed unit's effects (pushes to `hub`, reviews opened,
        counted by `reviews_opened`); `backpressure` hears of every save."""
        self.data_dir = data_dir
        self.meter = meter
        self.params = params
        self._lock = lock
        self.views = views
        self.app = app
        self.runner = runner
        self.queries = queries
        self.hub = hub
        self.backpressure = backpressure
        self._reviews_opened = reviews_opened
        self.started_at = time.time()

    @property
    def review_triggers(self) -> int:
        return self._reviews_opened.value

    # -- the projectors (Runtime) ---------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.runner.running

    @property
    def last_error(self) -> str | None:
        return self.runner.last_error

    @property
    def failure_reason(self) -> str | None:
        return self.runner.failure_reason

    def position(self, partition: int | None = None) -> int:
        return self.runner.position()  # one log, one partition: the same position

    def log_position(self) -> int:
        return self.runner.log_position()

    def wait_until(self, position: int, timeout: float = 30.0, partition: int | None = None) -> bool:
        return self.runner.wait_until(position, timeout)

    def conversation_partition(self, tenant: str, conversation_id: str) -> int | None:
        return None  # the runner applies the log in one order: no partition to wait for apart

    def catch_up(self) -> None:
        if self.runner.running:
            self.wait_until(self.log_position(), timeout=60.0)
        else:
            self.runner.catch_up()

    def projections_status(self) -> dict[tuple[str, int], int]:
        return self.views.positions() or {(PROJECTIONS[0], 0): self.runner.position()}

    def host_counters(self) -> dict[str, dict[str, int]]:
        return {}  # one writer, in this process: nothing to fence or heal

    def capacity(self) -> CapacityProjection:
        return next(p for p in self.runner.projections if isinstance(p, CapacityProjection))

    def check(self) -> dict[str, Any]:
        return {}

    def mailbox_cost(self) -> tuple[float | None, int]:
        if self.meter is None:  # views handed in by a caller: their mailbox is not timed
            return None, 0
        return self.meter.seconds, self.meter.entries

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        self.runner.start()
        return self

    def close(self) -> None:
        self.runner.stop()
        self.hub.close()
        self.views.close()
        self.app.close()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
