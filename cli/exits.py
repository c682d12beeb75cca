"""How a command ends when it cannot start or cannot go on: one line `fanout: error: ...` on
stderr and an exit code, the one mapping of every command (`fanout ...`, `python -m
cli.worker`, `python -m cli.relay`):

* 2: what the operator fixes before starting again: a bad setting (ConfigError, CliError), an
  engine that does not answer at start-up (EngineUnavailable), a data dir in use, of another
  layout or ahead of its event store, a disk that is full or a path that cannot be written;
* 1: a process that cannot go on (ProcessFailed: the relay fenced by a newer one, Kafka
  refusing its transactions); the relay also says 1 for an engine that does not answer at
  start-up (`engine_down=1`, as `fanout relay --help` documents);
* 130: interrupted; 0: its output closed early (`fanout replay | head`).

Anything else is a bug: its traceback."""

from __future__ import annotations

import sys
from pathlib import Path

from domain.errors import FanoutError
from fanout.bootstrap import DataDirBusy, ShardCountMismatch, StoreLayoutError
from fanout.bootstrap.power_loss import AheadOfTheLog
from fanout.config import ConfigError, EngineUnavailable, ProcessFailed
from fanout.overload import startup_error

PROG = "fanout"


class CliError(RuntimeError):
    """A failure the user can fix: printed as one line, exit 2."""


# what the operator fixes before starting again: exit 2 with the exception's text
OPERATOR_ERRORS = (ConfigError, CliError, DataDirBusy, ShardCountMismatch, StoreLayoutError, AheadOfTheLog)


def exit_code(exc: BaseException, data_dir: Path | None = None, *, engine_down: int = 2) -> int | None:
    """Print the one line `exc` ends the command with and return its exit code; None for
    an exception that is none of these (a bug: the caller lets its traceback out)."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, BrokenPipeError):
        sys.stderr.close()
        return 0
    if isinstance(exc, (*OPERATOR_ERRORS, EngineUnavailable, ProcessFailed)):
        code = 1 if isinstance(exc, ProcessFailed) else engine_down if isinstance(exc, EngineUnavailable) else 2
        return _say(str(exc), code)
    if isinstance(exc, FanoutError):  # e.g. a claim the token refuses
        return _say(f"{exc.code}: {exc.message}", 2)
    if isinstance(exc, Exception) and data_dir is not None:  # a full disk or an unwritable data dir (ADR-0010)
        message = startup_error(data_dir, exc)
        if message is not None:
            return _say(message, 2)
    elif isinstance(exc, OSError):  # a command with no data dir of its own: the error's own words
        return _say(str(exc), 2)
    return None


def _say(line: str, code: int) -> int:
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    return code
