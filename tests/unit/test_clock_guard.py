"""The clock guard of an API replica (fanout/clock_guard.py, ADR-0041) over a fake reference:
writes refused while the replica's clock is further from the event store's than the bound,
either way, with a reason and what to do; accepted again once the clock is put right; a store
that does not answer changes nothing; FANOUT_MAX_CLOCK_SKEW bounded by what the reads tolerate."""

from __future__ import annotations

import pytest

from domain.errors import Unavailable
from fanout.clock_guard import ClockGuard
from fanout.config import load_settings
from fanout.overload import Backpressure

STORE = 1_800_000_000.0


class Store:
    """The event store's clock; `down` makes it fail as an unreachable server does."""

    def __init__(self) -> None:
        self.down = False

    def __call__(self) -> float:
        if self.down:
            raise ConnectionError("server closed the connection unexpectedly")
        return STORE


def guard(offset: list[float], store: Store | None = None, bound: float = 300.0) -> ClockGuard:
    return ClockGuard(store or Store(), lambda: STORE + offset[0], bound)


@pytest.mark.parametrize("off", [7200.0, -7200.0, 300.5, -301.0])
def test_a_clock_past_the_bound_either_way_refuses_with_the_reason_and_what_to_do(off: float) -> None:
    g = guard([off])
    assert g.measure() == pytest.approx(off)
    with pytest.raises(Unavailable) as refused:
        g.check()
    e = refused.value
    assert e.details["reason"] == "clock_skew" and e.details["retry_after_ms"] > 0
    assert e.details["clock_skew_seconds"] == pytest.approx(off)
    assert ("ahead of" if off > 0 else "behind") in e.message
    assert "FANOUT_MAX_CLOCK_SKEW" in e.message and "NTP" in e.message
    assert g.refusals == 1


@pytest.mark.parametrize("off", [0.0, 299.9, -300.0])
def test_a_clock_within_the_bound_writes(off: float) -> None:
    g = guard([off])
    g.measure()
    g.check()
    assert g.refusals == 0


def test_unmeasured_writes_and_a_clock_put_right_writes_again() -> None:
    offset = [3600.0]
    g = guard(offset)
    g.check()  # never measured (the store not read yet): the store's own checks answer for it
    g.measure()
    with pytest.raises(Unavailable):
        g.check()
    offset[0] = 2.0  # NTP stepped the clock
    g.measure()
    g.check()


def test_a_store_that_does_not_answer_leaves_the_last_measurement() -> None:
    store, offset = Store(), [3600.0]
    g = guard(offset, store)
    g.measure()
    store.down, offset[0] = True, 0.0
    assert g.measure() is None
    with pytest.raises(Unavailable):  # still the last measurement's refusal, not a guess
        g.check()
    store.down = False
    g.measure()
    g.check()


def test_the_midpoint_of_the_two_readings_is_compared() -> None:
    readings = iter([STORE + 10.0, STORE + 30.0])  # the store read in between: 20 s ahead, not 10 or 30
    g = ClockGuard(Store(), lambda: next(readings), 300.0)
    assert g.measure() == pytest.approx(20.0)


def test_backpressure_runs_its_gates_before_counting_lag() -> None:
    class Runner:
        committed, last_error, failure_reason = 0, None, None

    g = guard([7200.0])
    bp = Backpressure(Runner(), 0, max_events=10, max_entries=10, gates=[g.check])
    bp.check()  # not measured yet
    g.measure()
    with pytest.raises(Unavailable) as refused:
        bp.check()
    assert refused.value.details["reason"] == "clock_skew"


def test_a_guard_needs_a_positive_bound() -> None:
    with pytest.raises(ValueError, match="positive bound"):
        ClockGuard(Store(), lambda: STORE, 0)


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600.0), ("300", 300.0), ("0", 0.0), ("30min", 1800.0)])
def test_fanout_max_clock_skew_is_a_duration(text: str, seconds: float) -> None:
    assert load_settings({"FANOUT_MAX_CLOCK_SKEW": text}).params.max_clock_skew == seconds


@pytest.mark.parametrize("text", ["2h", "31m", "-5s", "soon"])
def test_fanout_max_clock_skew_past_what_the_reads_tolerate_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(Exception, match="FANOUT_MAX_CLOCK_SKEW") as refused:
        load_settings({"FANOUT_MAX_CLOCK_SKEW": text})
    assert "\n" not in str(refused.value)
