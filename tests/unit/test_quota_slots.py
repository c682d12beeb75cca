"""The tenant bucket split into K slots (domain/quota.py, ADR-0023): whichever slots a set of
replicas charges, and whatever they borrow, the entries admitted in any window T are at most
C + R x T (ADR-0005's bound), a send is refused only when all slots together cannot pay it,
and the retry hint is the exact wait for the sum."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import example, given
from hypothesis import strategies as st

from domain.admission import TokenBucket
from domain.params import Parameters
from domain.quota import SlottedQuota, TenantQuota, TenantQuotaSlot, sum_retry_after

K = 8
EPS = 1e-6


def params(capacity: float, refill: float) -> Parameters:
    return dataclasses.replace(
        Parameters(), tenant_fanout_quota_capacity=capacity, tenant_fanout_quota_refill_per_sec=refill
    )


def slots(tenant: str = "acme", k: int = K, bucket: list[float] | None = None) -> list[TenantQuotaSlot]:
    return [TenantQuotaSlot(tenant=tenant, slot=i, slots=k, bucket=bucket) for i in range(k)]


def attempt(all_slots: list[TenantQuotaSlot], own: int, cost: int, p: Parameters, now: float) -> bool:
    q = SlottedQuota(all_slots[own], lambda: all_slots)
    if q.retry_after(cost, now, p) > 0:
        return False
    q.charge(cost, "c", p, now)
    assert all(s in all_slots for s in q.charged) and q.charged
    return True


@given(
    capacity=st.integers(min_value=8, max_value=400),
    refill=st.floats(min_value=0.5, max_value=100.0, allow_nan=False),
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=2.0, allow_nan=False),  # time to the next attempt
            st.integers(min_value=0, max_value=K - 1),  # the replica's own slot
            st.integers(min_value=1, max_value=60),  # entries
        ),
        max_size=120,
    ),
)
def test_admitted_entries_in_any_window_never_exceed_capacity_plus_refill_times_window(
    capacity: int, refill: float, steps: list[tuple[float, int, int]]
) -> None:
    p = params(capacity, refill)
    all_slots = slots()
    now = 1000.0
    admitted: list[tuple[float, int]] = []
    for dt, own, cost in steps:
        now += dt
        if attempt(all_slots, own, cost, p, now):
            admitted.append((now, cost))
    for i in range(len(admitted)):
        total = 0
        for j in range(i, len(admitted)):
            total += admitted[j][1]
            span = admitted[j][0] - admitted[i][0]
            assert total <= capacity + refill * span + EPS * capacity, (i, j, total, span)
    # every admitted entry was charged to exactly one slot, borrowed or not
    assert math.isclose(sum(s.charged_total for s in all_slots), sum(c for _, c in admitted), abs_tol=EPS)


def test_a_full_bucket_admits_exactly_its_capacity_from_one_replica_and_then_refuses() -> None:
    p = params(80, 8)
    all_slots = slots()
    now = 50.0
    admitted = 0
    while attempt(all_slots, 3, 1, p, now):  # slot 3 pays 10, then borrows the other 70
        admitted += 1
    assert admitted == 80  # what one bucket of capacity 80 admits at one instant
    q = SlottedQuota(all_slots[3], lambda: all_slots)
    assert q.retry_after(1, now, p) == 1 / 8  # every slot is empty: the sum refills at R
    assert q.retry_after(81, now, p) == math.inf  # more than the capacity: never


def test_a_send_its_slot_cannot_pay_borrows_from_the_fullest_slots_in_the_same_charge() -> None:
    p = params(80, 8)
    all_slots = slots()
    q = SlottedQuota(all_slots[0], lambda: all_slots)
    q.charge(25, "c", p, 10.0)  # own slot: 10, then 10 + 5 from two others
    assert [s.slot for s in q.charged][0] == 0 and len(q.charged) == 3
    assert sum(s.charged_total for s in all_slots) == 25
    loaded: list[int] = []

    def others() -> list[TenantQuotaSlot]:
        loaded.append(1)
        return all_slots

    q = SlottedQuota(all_slots[5], others)
    q.charge(4, "c", p, 10.0)  # its own slot pays: the others are not even loaded
    assert q.charged == [all_slots[5]] and not loaded


def test_replicas_that_borrow_at_once_lean_on_different_slots() -> None:
    """When one other slot can lend the whole rest, only that one is charged: the next such
    slot after the borrower's own in slot order. Replicas whose own slots are empty then
    borrow from different slots (each save races on two streams, not all on the fullest)."""
    p = params(80, 8)  # 8 slots of 10
    now = 10.0
    all_slots = slots()
    for k in (0, 2, 4, 6):  # four replicas' own slots, emptied
        all_slots[k].take(10, "c", p, now)
    all_slots[5].take(2, "c", p, now)  # slot 5 holds 8, the fullest are 1, 3, 7 (10 each)
    lenders = []
    for own in (0, 2, 4, 6):
        q = SlottedQuota(all_slots[own], lambda: all_slots)
        q.charge(6, "c", p, now)  # the own slot is empty: one lender pays all 6
        assert len(q.charged) == 1 and q.charged[0] is not all_slots[own]  # the empty own slot pays nothing
        lenders.append(q.charged[0].slot)
    assert lenders == [1, 3, 5, 7]  # the next slot after each own one that could lend 6
    assert sum(s.charged_total for s in all_slots) == 4 * 10 + 2 + 4 * 6


@given(
    available=st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=1, max_size=8),
    refill=st.floats(min_value=0.1, max_value=10.0, allow_nan=False),
    cost=st.floats(min_value=0.0, max_value=80.0, allow_nan=False),
)
@example(available=[0.0] * 7 + [1.55858501411682], refill=1.0, cost=80.0)  # all K full: once answered inf
def test_the_retry_hint_is_the_exact_wait_for_the_sum(available: list[float], refill: float, cost: float) -> None:
    capacity = 10.0
    wait = sum_retry_after(available, capacity, refill, cost)
    buckets = [TokenBucket(capacity, refill, a, 0.0) for a in available]
    if cost > capacity * len(available):
        assert wait == math.inf
        return
    assert sum(b.available(wait) for b in buckets) >= cost - 1e-6
    if wait > 1e-6:
        assert sum(b.available(wait - 1e-6) for b in buckets) < cost


def test_new_slots_continue_an_old_single_stream_bucket_without_a_fresh_burst() -> None:
    p = params(80, 8)
    legacy = TenantQuota(tenant="acme")
    legacy.charge(70, "c", p, 100.0)  # 10 left at t=100
    seeded = slots(bucket=TenantQuotaSlot.seed(legacy, K))
    q = SlottedQuota(seeded[0], lambda: seeded)
    assert q.retry_after(10, 100.0, p) == 0.0
    assert q.retry_after(11, 100.0, p) > 0.0
    assert slots()[0].level(p, 100.0).available(100.0) == 10  # a slot nobody charged before starts full
