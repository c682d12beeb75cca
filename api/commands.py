"""The sends' lane to the command side (ADR-0024): one thread that runs the sends the
event loop hands it one after another, and hands back every result of a run at once.

The application runs its commands under one lock, so eight executor threads sending at
once only queue on it, and each send paid a thread wake-up, the lock's hand-over and its
own wake-up of the event loop (a write to its self-pipe, an epoll round). Here the sends
that arrived while one ran are taken together: the loop is woken once per run, and a
thread that is already running takes the next; the application writes the run's sends in
one event-store transaction (`group`, ADR-0030). Other commands and the reads stay on the
executor (a REBUILD's wait for projection must not hold sends up).

A batch of sends (`POST /v1/messages/batch`) is one work item of several calls
(`call_many`): its calls join the run's calls, so a batch shares the run's transaction with
the sends queued beside it and is never a group inside a group (a send's answer gets its
position only when its group is written)."""

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

Outcome = tuple[Any, BaseException | None]  # a call's result, or the exception it raised
Work = tuple[Sequence[Callable[[], Any]], "asyncio.Future[Any]", bool]  # calls, future, many
Settled = tuple["asyncio.Future[Any]", Any, BaseException | None]


def one_by_one(calls: Sequence[Callable[[], Any]]) -> list[Outcome]:
    return [outcome(call) for call in calls]


class CommandLane:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str = "fanout-commands",
        *,
        group: Callable[[Sequence[Callable[[], Any]]], list[Outcome]] = one_by_one,
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
        self._queue.put(((partial(fn, *args, **kwargs),), future, False))
        return await future

    async def call_many(self, calls: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """Several calls taken together, in order, in one run (one hop, one wake-up): each
        call's (result, None) or (None, exception), as `group` returns them."""
        if not calls:
            return []
        future: asyncio.Future[list[Outcome]] = self.loop.create_future()
        self._queue.put((tuple(calls), future, True))
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
            calls = 0
            while item is not None:
                run.append(item)
                calls += len(item[0])
                if calls >= MAX_RUN:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            else:
                stop = True
            # a cancelled caller's command is skipped (a read of a flag the loop sets: at worst it runs)
            live = [work for work in run if not work[1].cancelled()]
            results = self.group([fn for fns, _, _ in live for fn in fns]) if live else []
            settled: list[Settled] = []
            at = 0
            for fns, future, many in live:
                mine, at = results[at : at + len(fns)], at + len(fns)
                settled.append((future, mine, None) if many else (future, *mine[0]))
            if settled:
                with suppress(RuntimeError):  # the loop is closed: nobody waits for these any more
                    self.loop.call_soon_threadsafe(_settle, settled)


def _settle(outcomes: list[Settled]) -> None:
    for future, result, exc in outcomes:
        if future.done():  # cancelled while it ran
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
