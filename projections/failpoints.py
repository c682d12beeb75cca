"""Fault-injection points for the crash and fencing tests (no effect unless configured).

A host or store calls `hit(name)` at a step where a real process can be paused or killed
(a long GC pause, a VM stall): between the steps of a Cassandra commit, say. The tests
start a process with FANOUT_FAILPOINTS naming the points and what happens there:

    FANOUT_FAILPOINTS="commit.heads=stop@MessageSent#2"

* `stop`: the process stops itself with SIGSTOP at that very step (the test sends SIGCONT
  later), once.
* `kill`: the process kills itself with SIGKILL at that very step (kill -9 at a named
  step: the crash tests assert what was written before it), once.
* `fail`: the step raises `InjectedFailure` (a ConnectionError, as a request on a connection
  an engine's restart killed raises), once.
* `@label`: only where the caller's labels include it (the host labels a unit with the
  kinds of the events it applies: MessageSent, MembersJoined, ...); without it, any hit.
* `#n`: at the n-th such hit (default the first).

With FANOUT_FAILPOINTS_FIRED set to a directory, a point fires only where it can create the
file `<directory>/<name>` (the first process to get there, of all started with the same
setting: two workers sharing partitions, the one that takes over after the first is killed
runs on), and the file, holding the pid, tells the test the fault landed at its step.

Read once from the environment at the first hit; costs a dict lookup per hit when unset."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterable

log = logging.getLogger("fanout.failpoints")
ENV = "FANOUT_FAILPOINTS"
FIRED_ENV = "FANOUT_FAILPOINTS_FIRED"


class InjectedFailure(ConnectionError):
    """Raised by a `fail` failpoint."""


ACTIONS = ("stop", "kill", "fail")
_points: dict[str, tuple[str, str | None, int]] | None = None
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, str | None, int]]:
    out: dict[str, tuple[str, str | None, int]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("#")
        action, _, label = action.partition("@")
        if action not in ACTIONS:
            raise ValueError(f"{ENV}: unknown action {action!r} in {item!r} (known: {', '.join(ACTIONS)})")
        out[name.strip()] = (action, label or None, int(nth or 1))
    return out


def _first_to_fire(name: str) -> bool:
    fired = os.environ.get(FIRED_ENV)
    if not fired:
        return True
    try:
        fd = os.open(os.path.join(fired, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def hit(name: str, labels: Iterable[str] = ()) -> None:
    global _points
    if _points is None:
        _points = _parse(os.environ.get(ENV, ""))
    point = _points.get(name)
    if point is None:
        return
    action, label, nth = point
    if label is not None and label not in set(labels):
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != nth or not _first_to_fire(name):
        return
    log.warning("failpoint %s: %s (pid %d)", name, action, os.getpid())
    if action == "fail":
        raise InjectedFailure(f"failpoint {name}: an injected failure")
    if action == "kill":
        logging.shutdown()  # the warning above reaches the process's log before it dies
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        # Directed at this thread, not the process: a process-directed SIGSTOP is taken by
        # the main thread, and this one ran on (a Cassandra round, a whole commit) until the
        # stop reached it, so the pause fell after the step it names. A signal to the calling
        # thread is taken on the return from this call: the process stops right here.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
