"""When the worker's agent gathers another take into the unit it is building (ADR-0052,
streams/worker.py `gathers_more`): only behind (a full take), within the unit's size and time
bounds; a worker that keeps up applies every take as it comes."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fanout.config import WorkerOptions
from streams.worker import WorkerSettings, gathers_more


def worker_settings(**knobs: Any) -> WorkerSettings:
    """The worker's settings with the default knobs but `knobs`."""
    options = asdict(replace(WorkerOptions(), **knobs))
    return WorkerSettings(brokers="127.0.0.1:9092", topic="events", replication=1, **options)


S = worker_settings(batch=500, within=0.05, unit_events=4000, gather_for=1.0)


def test_a_take_that_is_not_full_is_applied_at_once() -> None:
    assert not gathers_more(499, 5000, 499, 0.0, S)
    assert not gathers_more(1, 0, 3501, 0.2, S)  # the end of a backlog closes the unit


def test_full_takes_gather_up_to_the_unit_size() -> None:
    assert gathers_more(500, 500, 500, 0.0, S)
    assert gathers_more(500, 4096, 3500, 0.5, S)  # one more take of 500 still fits 4000
    assert not gathers_more(500, 4096, 3501, 0.5, S)
    assert not gathers_more(500, 4096, 4000, 0.5, S)


def test_a_full_take_without_a_whole_take_waiting_is_applied_at_once() -> None:
    """At the edge of keeping up the next take would wait `within` to fill: not worth it."""
    assert not gathers_more(500, 499, 500, 0.0, S)
    assert not gathers_more(500, 0, 1000, 0.0, S)


def test_a_unit_stops_gathering_after_gather_for() -> None:
    assert gathers_more(500, 500, 1000, 0.99, S)
    assert not gathers_more(500, 500, 1000, 1.0, S)


def test_unit_events_equal_to_the_take_turns_gathering_off() -> None:
    off = worker_settings(batch=500, unit_events=500)
    assert not gathers_more(500, 500, 500, 0.0, off)


@given(
    takes=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 5000)), min_size=1, max_size=40),
    unit_events=st.integers(min_value=500, max_value=10_000),
)
def test_a_gathered_unit_never_exceeds_unit_events(takes: list[tuple[int, int]], unit_events: int) -> None:
    """Whatever the takes, the agent's loop (gather while gathers_more) never builds a unit
    larger than unit_events, and every unit but the last ends on a take that was not full or
    at the size bound."""
    s = worker_settings(batch=500, unit_events=unit_events)
    gathered = 0
    for took, waiting in takes:
        gathered += took
        assert gathered <= max(unit_events, s.batch)
        if not gathers_more(took, waiting, gathered, 0.0, s):
            gathered = 0
