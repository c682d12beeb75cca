"""How a projection host and the command side tell a storage failure from a bug
(ADR-0010), and log a failure that recurs without flooding the log.

Kept beside the projections, not in the service layer, so that the projection host
(streams/host.py) and the service layer share one definition:
`storage_failure(exc)` finds a full disk or a failing store anywhere in an exception's
chain: a port error an adapter raised (projections/errors.py), or the operating system's
OSError; `Throttled` logs a recurring condition once per interval, with a count; `first_line`
is the one line of a message every layer logs or answers with."""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any

from projections.errors import StorageError, StorageFull

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def exception_chain(exc: BaseException) -> list[BaseException]:
    """exc, then its causes and contexts (at most 16, no loops)."""
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in seen and len(seen) < 16:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def storage_failure(exc: BaseException) -> str | None:
    """'storage_full' (no space, quota, file size limit), 'storage_error' (another failure of
    a store: an I/O error, a store that did not answer), or None when the exception is not
    about storage."""
    reason: str | None = None
    for e in exception_chain(exc):
        if isinstance(e, StorageFull) or (isinstance(e, OSError) and e.errno in _FULL_ERRNOS):
            return "storage_full"
        if (isinstance(e, StorageError) and e.reason is not None) or isinstance(e, OSError):
            reason = "storage_error"
    return reason


def innermost(exc: BaseException) -> BaseException:
    """The exception an exception chain started from (the engine's own, under the wrappers)."""
    return exception_chain(exc)[-1]


def first_line(what: BaseException | str, limit: int = 300) -> str:
    """The first line of a message that says something, at most `limit` characters: a text's,
    or an exception's own (its type's name when it says nothing). The one line an operator
    reads where a whole message or a traceback would flood the log."""
    for line in str(what).strip().splitlines():
        if line.strip():
            return line.strip()[:limit]
    return type(what).__name__ if isinstance(what, BaseException) else ""


class Throttled:
    """Log a recurring condition at most once per `interval` seconds, with how many
    times it happened since the last line. No traceback: the first line says what."""

    def __init__(self, logger: logging.Logger, interval: float = 30.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str, level: int, message: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._count[key] = self._count.get(key, 0) + 1
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                return
            n = self._count.pop(key)
            self._last[key] = now
        suffix = f" ({n} times in the last {self.interval:g} s)" if n > 1 else ""
        self.logger.log(level, message + suffix, *args)
