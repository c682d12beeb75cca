"""The sends' lane to the command side (api/commands.py, ADR-0024): results and errors reach
their callers, in the order the calls were made; a caller cancelled before its turn is
skipped; close() runs what is queued."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pytest

from api.commands import CommandLane, one_by_one


async def test_each_caller_gets_its_own_result_and_the_calls_run_in_order_on_one_thread() -> None:
    lane = CommandLane(asyncio.get_running_loop())
    ran: list[int] = []
    threads: set[int] = set()

    def work(i: int) -> int:
        ran.append(i)
        threads.add(threading.get_ident())
        return i * i

    try:
        results = await asyncio.gather(*(lane.call(work, i) for i in range(200)))
    finally:
        lane.close()
    assert results == [i * i for i in range(200)]
    assert ran == list(range(200))
    assert len(threads) == 1 and threading.get_ident() not in threads


async def test_an_error_reaches_its_caller_only() -> None:
    lane = CommandLane(asyncio.get_running_loop())

    def work(i: int) -> int:
        if i == 3:
            raise ValueError("three")
        return i

    try:
        results = await asyncio.gather(*(lane.call(work, i) for i in range(6)), return_exceptions=True)
    finally:
        lane.close()
    assert [r if not isinstance(r, Exception) else str(r) for r in results] == [0, 1, 2, "three", 4, 5]


async def test_a_caller_cancelled_before_its_turn_is_skipped() -> None:
    lane = CommandLane(asyncio.get_running_loop())
    gate = threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        gate.wait(5)
        ran.append("blocker")

    def work(name: str) -> str:
        ran.append(name)
        return name

    try:
        first = asyncio.ensure_future(lane.call(blocker))
        await asyncio.sleep(0.05)  # the lane is in blocker
        doomed = asyncio.ensure_future(lane.call(work, "doomed"))
        await asyncio.sleep(0)
        doomed.cancel()
        await asyncio.sleep(0.01)
        kept = asyncio.ensure_future(lane.call(work, "kept"))
        await asyncio.sleep(0.01)
        gate.set()
        assert await kept == "kept"
        await first
        with pytest.raises(asyncio.CancelledError):
            await doomed
    finally:
        lane.close()
    assert ran == ["blocker", "kept"]


async def test_close_runs_what_is_queued_then_stops_the_thread() -> None:
    lane = CommandLane(asyncio.get_running_loop())
    ran: list[int] = []
    calls = [asyncio.ensure_future(lane.call(ran.append, i)) for i in range(10)]
    await asyncio.sleep(0)
    await asyncio.get_running_loop().run_in_executor(None, lane.close)
    await asyncio.gather(*calls)
    assert ran == list(range(10))
    assert not lane._thread.is_alive()


async def test_a_batch_joins_the_run_of_the_calls_beside_it_and_gets_each_outcome() -> None:
    """call_many: one work item of several calls; its calls go into the same `group` call as
    the single calls queued with it (never a group inside a group), in queue order, and it
    gets each call's (result, exception) back."""
    runs: list[list[str]] = []
    gate = threading.Event()

    def group(calls: Sequence[Callable[[], Any]]) -> list[tuple[Any, BaseException | None]]:
        out = one_by_one(calls)
        runs.append([str(r) if e is None else f"!{e}" for r, e in out])
        return out

    def work(name: str) -> str:
        if name == "bad":
            raise ValueError("refused")
        return name

    lane = CommandLane(asyncio.get_running_loop(), group=group)
    try:
        first = asyncio.ensure_future(lane.call(gate.wait, 5))
        await asyncio.sleep(0.05)  # the lane is in the first run
        a = asyncio.ensure_future(lane.call(work, "a"))
        many = asyncio.ensure_future(lane.call_many([partial(work, "b1"), partial(work, "bad"), partial(work, "b3")]))
        c = asyncio.ensure_future(lane.call(work, "c"))
        await asyncio.sleep(0.01)
        gate.set()
        await first
        assert await a == "a" and await c == "c"
        outcomes = await many
    finally:
        lane.close()
    assert [r for r, _ in outcomes] == ["b1", None, "b3"]
    assert isinstance(outcomes[1][1], ValueError) and outcomes[0][1] is None
    assert runs == [["True"], ["a", "b1", "!refused", "b3", "c"]]
    assert await lane.call_many([]) == []
