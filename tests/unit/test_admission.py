"""Property tests of the admission token bucket (ADR decision 6, invariant A)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from domain.admission import TokenBucket, retry_after_ms

EPS = 1e-6

capacities = st.floats(min_value=0.5, max_value=1_000.0, allow_nan=False)
rates = st.floats(min_value=0.01, max_value=1_000.0, allow_nan=False)
steps = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), st.floats(min_value=0.0, max_value=5.0)),
    max_size=80,
)


def run(bucket: TokenBucket, start: float, attempts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Try each (delay, cost) in turn the way the aggregate does; returns the accepted (time, cost)."""
    now = start
    accepted = []
    for delay, cost in attempts:
        now += delay
        if bucket.retry_after(cost, now) == 0.0:
            bucket.take(cost, now)
            accepted.append((now, cost))
    return accepted


def assert_window_bound(accepted: list[tuple[float, float]], capacity: float, rate: float) -> None:
    """In any window [t, t + T], what was accepted is at most capacity + rate x T."""
    for i in range(len(accepted)):
        total = 0.0
        for j in range(i, len(accepted)):
            total += accepted[j][1]
            span = accepted[j][0] - accepted[i][0]
            assert total <= capacity + rate * span + EPS * max(1.0, capacity), (i, j, total, span)


@given(capacity=capacities, rate=rates, attempts=steps, start=st.floats(min_value=0.0, max_value=1e6))
def test_accepted_cost_in_any_window_never_exceeds_capacity_plus_rate_times_window(capacity, rate, attempts, start):
    bucket = TokenBucket.full(capacity, rate, start)
    accepted = run(bucket, start, [(d, min(c, capacity)) for d, c in attempts])
    assert_window_bound(accepted, capacity, rate)


@given(
    capacity=st.integers(min_value=1, max_value=20),
    rate=rates,
    delays=st.lists(st.floats(min_value=0.0, max_value=3.0, allow_nan=False), max_size=100),
)
def test_accepted_messages_in_any_window_never_exceed_capacity_plus_rate_times_window(capacity, rate, delays):
    bucket = TokenBucket.full(capacity, rate, 0.0)
    accepted = run(bucket, 0.0, [(d, 1.0) for d in delays])
    assert_window_bound(accepted, capacity, rate)


@st.composite
def drained_buckets(draw: st.DrawFn) -> tuple[TokenBucket, float]:
    """A bucket after some random takes, and the time it was last used."""
    capacity = draw(capacities)
    rate = draw(rates)
    start = draw(st.floats(min_value=0.0, max_value=1e5, allow_nan=False))
    bucket = TokenBucket.full(capacity, rate, start)
    attempts = draw(steps)
    accepted = run(bucket, start, [(d, min(c, capacity)) for d, c in attempts])
    now = accepted[-1][0] if accepted else start
    now += draw(st.floats(min_value=0.0, max_value=5.0, allow_nan=False))
    return bucket, now


@given(case=drained_buckets(), data=st.data())
def test_retry_after_is_exact_trying_then_succeeds_and_slightly_before_fails(case, data):
    bucket, now = case
    cost = data.draw(st.floats(min_value=0.01, max_value=bucket.capacity))
    wait = bucket.retry_after(cost, now)
    assert wait >= 0.0
    if wait == 0.0:
        assert bucket.available(now) >= cost - 1e-9
        return
    assert bucket.retry_after(cost, now + wait) == 0.0
    before = min(wait / 2, 1e-3)
    if before * bucket.refill_per_sec > 1e-6:
        assert bucket.retry_after(cost, now + wait - before) > 0.0


@given(case=drained_buckets(), data=st.data())
def test_retrying_after_the_millisecond_hint_succeeds(case, data):
    bucket, now = case
    cost = data.draw(st.floats(min_value=0.01, max_value=bucket.capacity))
    wait = bucket.retry_after(cost, now)
    if wait == 0.0:
        return
    ms = retry_after_ms(wait)
    assert ms >= 1
    assert bucket.retry_after(cost, now + ms / 1000) == 0.0


@given(
    capacity=st.integers(min_value=1, max_value=2_000_000),
    rate=st.floats(min_value=1.0, max_value=400_000.0),
    epoch=st.floats(min_value=1.6e9, max_value=2.0e9),
    cost=st.integers(min_value=1, max_value=2_000_000),
    spent=st.floats(min_value=0.0, max_value=1.0),
)
def test_retrying_after_the_millisecond_hint_succeeds_at_wall_clock_epoch_times(capacity, rate, epoch, cost, spent):
    """Wall-clock times (~1.7e9 s) have ~2e-7 s of float resolution; the hint must still hold."""
    cost = min(cost, capacity)
    bucket = TokenBucket.full(capacity, rate, epoch)
    bucket.take(capacity * spent, epoch)
    wait = bucket.retry_after(cost, epoch)
    if wait == 0.0:
        return
    assert bucket.retry_after(cost, epoch + retry_after_ms(wait) / 1000) == 0.0


@given(capacity=capacities, rate=rates, extra=st.floats(min_value=0.001, max_value=1e6))
def test_a_cost_above_capacity_can_never_be_paid_and_says_so(capacity, rate, extra):
    bucket = TokenBucket.full(capacity, rate, 0.0)
    assert bucket.retry_after(capacity + extra, 0.0) == math.inf
    assert bucket.retry_after(capacity + extra, 1e9) == math.inf
    assert retry_after_ms(math.inf) == -1


@given(seconds=st.floats(min_value=0.0, max_value=1e6, allow_nan=False))
def test_retry_after_ms_rounds_up_to_at_least_one_millisecond(seconds):
    ms = retry_after_ms(seconds)
    assert ms >= 1
    assert ms / 1000 >= seconds


@given(capacity=capacities, rate=rates, start=st.floats(min_value=0.0, max_value=1e6), later=st.floats(0.0, 1e6))
def test_a_bucket_never_holds_more_than_its_capacity(capacity, rate, start, later):
    bucket = TokenBucket.full(capacity, rate, start)
    bucket.take(capacity / 2, start)
    assert bucket.available(start + later) <= capacity


@given(case=drained_buckets(), later=st.floats(min_value=0.0, max_value=100.0))
def test_a_bucket_state_round_trips_so_a_replay_gives_the_same_answers(case, later):
    bucket, now = case
    again = TokenBucket.from_state(bucket.to_state())
    assert again == bucket
    assert again.retry_after(1.0, now + later) == bucket.retry_after(1.0, now + later)


@given(case=drained_buckets(), back=st.floats(min_value=0.001, max_value=100.0))
def test_a_clock_that_steps_back_never_mints_tokens(case, back):
    bucket, now = case
    before = bucket.available(now)
    assert bucket.available(now - back) <= max(before, bucket.tokens) + 1e-9
