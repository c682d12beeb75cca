"""Overload and storage failure (ADR-0010): what the process refuses, and how it says so.

* `storage_unavailable(exc)`: a full disk or a failing store (`storage_failure`,
  projections/failures.py: the port errors of projections/errors.py the adapters raise, or
  an OSError), or a store that did not answer (Cassandra with too few replicas, timeouts,
  no host: ADR-0027), is answered with 503 UNAVAILABLE instead of a bare 500.
* `Backpressure` refuses writes the read side has to materialize once the projector is
  behind the log by more than a bound, or while its last attempt failed. O(1) per check:
  the application reports what it recorded (positions, mailbox entries of each send),
  the runner keeps its committed position in memory; no query per send.
* `raise_fd_limit()` lifts RLIMIT_NOFILE's soft limit to the hard one at `serve` start.
* `Throttled` and `storage_failure` live in projections/failures.py (the projection
  hosts use them too)."""

from __future__ import annotations

import logging
import resource
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from domain.errors import Unavailable
from projections.errors import StorageError, StorageUnavailable
from projections.failures import exception_chain, first_line, innermost, storage_failure

log = logging.getLogger("fanout.overload")

# Retry hints (ms). A full disk needs an operator; lag drains at the projector's rate.
STORAGE_RETRY_MS = 5_000
PROJECTOR_RETRY_MS = 5_000
MIN_LAG_RETRY_MS = 1_000
MAX_LAG_RETRY_MS = 60_000
# Drain rates assumed for the lag retry hint: the ADR worst case (2 msg/s into 100k members)
# for entries, about the command side's ceiling for events (docs/PERFORMANCE.md section 6).
DRAIN_ENTRIES_PER_SEC = 200_000
DRAIN_EVENTS_PER_SEC = 1_000


def storage_unavailable(exc: BaseException) -> Unavailable | None:
    chain = exception_chain(exc)
    if any(isinstance(e, StorageUnavailable) for e in chain):  # the views' store (Cassandra, ADR-0027)
        return Unavailable(
            f"the views' store did not answer ({first_line(innermost(exc))}); retry later",
            reason="storage_error",
            retry_after_ms=STORAGE_RETRY_MS,
        )
    reason = storage_failure(exc)
    if reason is None:
        return None
    what = "the disk is full" if reason == "storage_full" else "a storage I/O error"
    return Unavailable(
        f"not written: {what} ({first_line(innermost(exc))}); nothing was changed, retry later",
        reason=reason,
        retry_after_ms=STORAGE_RETRY_MS,
    )


def startup_error(data_dir: Path, exc: BaseException) -> str | None:
    """One line for a data dir (or file) the process cannot open or write: a full disk,
    not a directory, no permission. None when the exception is something else."""
    chain = exception_chain(exc)
    if any(isinstance(e, StorageUnavailable) for e in chain):
        return None  # a store on another machine that did not answer: not the data dir's
    reason = storage_failure(exc)
    if reason is None and not any(isinstance(e, OSError | StorageError) for e in chain):
        return None
    os_error = next((e for e in chain if isinstance(e, OSError) and e.filename), None)
    if os_error is not None:
        where, what = os_error.filename, os_error.strerror or first_line(innermost(os_error))
    else:
        where, what = data_dir, first_line(innermost(exc))
    hint = " (the disk is full: free space, then start again)" if reason == "storage_full" else ""
    return f"cannot use {where}: {what}{hint}"


# -- file descriptors -------------------------------------------------------------------

NOFILE_CEILING = 1_048_576  # when the hard limit is unlimited


def raise_fd_limit() -> tuple[int, int]:
    """Set RLIMIT_NOFILE's soft limit to the hard limit; returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
            return soft, soft
        return soft, target
    return soft, soft


def fd_soft_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return NOFILE_CEILING if soft == resource.RLIM_INFINITY else int(soft)


# -- backpressure -------------------------------------------------------------------------


class RunnerState(Protocol):
    committed: int
    last_error: str | None
    failure_reason: str | None


class Backpressure:
    """Refuse writes while the read side cannot keep up (ADR-0010).

    Lag is counted two ways, both without a query: events (log positions written and
    not yet committed by the projector) and mailbox entries (the `fanout_entries` of
    the sends among them). Entries measure the projector's work; events bound a backlog
    of many cheap events. A backlog found at start-up counts as events only."""

    def __init__(
        self,
        runner: RunnerState,
        written: int,
        *,
        max_events: int,
        max_entries: int,
        gates: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.runner = runner
        self.max_events = max_events
        self.max_entries = max_entries
        self.written = written
        self._sends: deque[tuple[int, int]] = deque()  # (position, entries written through it)
        self._total = 0
        self._projected = 0  # entries written through the last pruned send
        self._lock = threading.Lock()
        self.refusals = 0
        # more refusals of the same kind, checked first, each raising Unavailable (O(1), no
        # query): an API replica's clock guard (fanout/clock_guard.py, ADR-0041)
        self.gates = tuple(gates)

    def recorded(self, positions: Sequence[tuple[int, int]]) -> None:
        """After a save (in the writer's lock): (position, mailbox entries) per event."""
        with self._lock:
            for position, entries in positions:
                if entries:
                    self._total += entries
                    self._sends.append((position, self._total))
                if position > self.written:
                    self.written = position

    def lag(self) -> tuple[int, int]:
        """(events, mailbox entries) written and not yet materialized."""
        committed = self.runner.committed
        with self._lock:
            sends = self._sends
            while sends and sends[0][0] <= committed:
                self._projected = sends.popleft()[1]
            return max(0, self.written - committed), self._total - self._projected

    def check(self) -> None:
        """Raise Unavailable when a write now would be acknowledged but not materialized (or
        materialized where the reads would not find it: a gate's refusal)."""
        for gate in self.gates:
            gate()
        failed = self.runner.last_error
        if failed is not None:
            self.refusals += 1
            reason = self.runner.failure_reason or "projector_failed"
            raise Unavailable(
                f"not accepted: the projector cannot materialize writes ({failed}); retry later",
                reason=reason,
                retry_after_ms=STORAGE_RETRY_MS if reason.startswith("storage") else PROJECTOR_RETRY_MS,
            )
        events, entries = self.lag()
        if events > self.max_events or entries > self.max_entries:
            self.refusals += 1
            # Hint: the time to drain back to half the bound at the assumed rates.
            seconds = max(
                (entries - self.max_entries / 2) / DRAIN_ENTRIES_PER_SEC,
                (events - self.max_events / 2) / DRAIN_EVENTS_PER_SEC,
            )
            retry_ms = int(min(MAX_LAG_RETRY_MS, max(MIN_LAG_RETRY_MS, seconds * 1000)))
            raise Unavailable(
                f"not accepted: the read side is behind by {events} events / {entries} mailbox entries "
                f"(bounds {self.max_events} / {self.max_entries}); retry later",
                reason="projection_lag",
                lag_events=events,
                lag_entries=entries,
                retry_after_ms=retry_ms,
            )
