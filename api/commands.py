"""The sends' lane to the command side (ADR-0024): one thread that runs the sends the
event loop hands it one after another, and hands back every result of a run at once.

The application runs its commands under one lock, so eight executor threads sending at
once only queue on it, and each send paid a thread wake-up, the lock's hand-over and its
own wake-up of the event loop (a write to its self-pipe, an epoll round). Here the sends
that arrived while one ran are taken together: the loop is woken once per run, and a
thread that is already running takes the next; the application writes the run's sends in
one event-store transaction (`group`, ADR-0030). Other commands and the reads stay on the
executor (a REBUILD's wait for projection must not hold sends up)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from typing import Any, TypeVar

from fanout.units import outcome

T = TypeVar("T")

MAX_RUN = 64  # sends taken together at most, so the first of a run is not answered too late

Work = tuple[Callable[[], Any], "asyncio.Future[Any]"]
Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]


def one_by_one(calls: Sequence[Callable[[], Any]]) -> list[tuple[Any, BaseException | None]]:
    return [outcome(call) for call in calls]


class CommandLane:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str = "fanout-commands",
        *,
        group: Callable[[Sequence[Callable[[], Any]]], list[tuple[Any, BaseException | None]]] = one_by_one,
    ) -> None:
        """`group`: runs the commands of one run and returns each one's outcome, in order
        (`FanoutApplication.grouped`: one event-store transaction for the run, ADR-0030)."""
        self.loop = loop
        self.group = group
        self._queue: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on the lane's thread. A caller cancelled before its turn is
        skipped (as an executor skips a cancelled work item); once begun, the command runs
        to its end either way."""
        future: asyncio.Future[T] = self.loop.create_future()
        self._queue.put((partial(fn, *args, **kwargs), future))
        return await future

    def close(self, timeout: float = 30.0) -> None:
        """Run what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            run: list[Work] = []
            while item is not None:
                run.append(item)
                if len(run) >= MAX_RUN:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            else:
                stop = True
            # a cancelled caller's command is skipped (a read of a flag the loop sets: at worst it runs)
            live = [(fn, future) for fn, future in run if not future.cancelled()]
            results = self.group([fn for fn, _ in live]) if live else []
            outcomes: list[Outcome] = [(future, r, e) for (_, future), (r, e) in zip(live, results, strict=True)]
            if outcomes:
                with suppress(RuntimeError):  # the loop is closed: nobody waits for these any more
                    self.loop.call_soon_threadsafe(_settle, outcomes)


def _settle(outcomes: list[Outcome]) -> None:
    for future, result, exc in outcomes:
        if future.done():  # cancelled while it ran
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
