"""The tenant fan-out token bucket, charged with mailbox entries: TenantQuota (one stream per
tenant: the embedded runtime, one writer) or the same bucket split into K TenantQuotaSlot
streams (API replicas on a shared store, ADR-0023)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

from domain.admission import TokenBucket
from domain.identity import scoped_name
from domain.params import Parameters

_NS = UUID("0b8c8a52-3f7e-4d6c-8e55-1f7d2a9c4b31")


class TenantQuota(Aggregate):
    class Created(Aggregate.Created):
        tenant: str

    class Charged(Aggregate.Event):
        entries: int
        conversation_id: str
        capacity: float
        refill_per_sec: float
        at: float

    @staticmethod
    def create_id(tenant: str, *_: Any, **__: Any) -> UUID:
        return uuid5(_NS, scoped_name("tenant-quota", tenant))  # ADR-0008

    @event(Created)
    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.bucket: list[float] | None = None
        self.charged_total = 0

    def _bucket(self, params: Parameters, now: float) -> TokenBucket:
        return TokenBucket.resume(
            self.bucket, params.tenant_fanout_quota_capacity, params.tenant_fanout_quota_refill_per_sec, now
        )

    def retry_after(self, entries: int, now: float, params: Parameters) -> float:
        return self._bucket(params, now).retry_after(entries, now)

    def charge(self, entries: int, conversation_id: str, params: Parameters, now: float) -> None:
        self._charged(
            entries=entries,
            conversation_id=conversation_id,
            capacity=params.tenant_fanout_quota_capacity,
            refill_per_sec=params.tenant_fanout_quota_refill_per_sec,
            at=now,
        )

    @event(Charged)
    def _charged(self, entries: int, conversation_id: str, capacity: float, refill_per_sec: float, at: float) -> None:
        self.bucket = TokenBucket.charged(self.bucket, entries, capacity, refill_per_sec, at)
        self.charged_total += entries


# -- the tenant bucket split into slots (ADR-0023) ---------------------------------------------

# How many slots a tenant's bucket is split into on a shared store. A constant of the code,
# stored in each slot's Created event: the bound is sum over the K slots, so K must not change
# under a running tenant (more slots would start full: a fresh burst; fewer would drop tokens).
QUOTA_SLOTS = 8


class Quota(Protocol):
    """What Conversation.send needs of the tenant bucket: TenantQuota (one stream, the
    embedded runtime) or SlottedQuota (K slot streams, API replicas on a shared store)."""

    def retry_after(self, entries: int, now: float, params: Parameters) -> float: ...

    def charge(self, entries: int, conversation_id: str, params: Parameters, now: float) -> None: ...


class TenantQuotaSlot(Aggregate):
    """Slot k of K of a tenant's fan-out bucket: capacity C/K, refill R/K. The tenant's
    bucket is the sum of its slots, so whatever a set of replicas charges to whichever
    slots, the entries admitted in any window T are at most C + R x T (ADR-0005's bound).
    A replica charges its own slot; a send its slot cannot pay borrows the rest from the
    others in the same save (`SlottedQuota`)."""

    class Created(Aggregate.Created):
        tenant: str
        slot: int
        slots: int
        bucket: list[float] | None  # the starting level (None: full); see `seed`

    class Charged(Aggregate.Event):
        tokens: float
        conversation_id: str
        capacity: float
        refill_per_sec: float
        at: float

    @staticmethod
    def create_id(tenant: str, slot: int, *_: Any, **__: Any) -> UUID:
        return uuid5(_NS, scoped_name("tenant-quota-slot", tenant, str(int(slot))))

    @event(Created)
    def __init__(self, tenant: str, slot: int, slots: int, bucket: list[float] | None) -> None:
        self.tenant = tenant
        self.slot = slot
        self.slots = slots
        self.bucket = bucket
        self.charged_total = 0.0

    @staticmethod
    def seed(legacy: TenantQuota | None, slots: int) -> list[float] | None:
        """A new slot's starting level: full, or, when the tenant was charged on its one
        TenantQuota stream before (a store written by an earlier version), 1/K of that
        bucket's level at its last charge. That stream is never written once slots are in
        use, so every slot gets the same seed and the sum continues the old bucket: an
        upgrade hands out no fresh burst."""
        if legacy is None or legacy.bucket is None:
            return None
        capacity, refill, tokens, updated_at = legacy.bucket
        return [capacity / slots, refill / slots, tokens / slots, updated_at]

    def level(self, params: Parameters, now: float) -> TokenBucket:
        return TokenBucket.resume(
            self.bucket,
            params.tenant_fanout_quota_capacity / self.slots,
            params.tenant_fanout_quota_refill_per_sec / self.slots,
            now,
        )

    def take(self, tokens: float, conversation_id: str, params: Parameters, now: float) -> None:
        self._charged(
            tokens=tokens,
            conversation_id=conversation_id,
            capacity=params.tenant_fanout_quota_capacity / self.slots,
            refill_per_sec=params.tenant_fanout_quota_refill_per_sec / self.slots,
            at=now,
        )

    @event(Charged)
    def _charged(self, tokens: float, conversation_id: str, capacity: float, refill_per_sec: float, at: float) -> None:
        self.bucket = TokenBucket.charged(self.bucket, tokens, capacity, refill_per_sec, at)
        self.charged_total += tokens


class SlottedQuota:
    """The tenant bucket as K slots, seen from one replica: its own slot pays when it can;
    otherwise `others()` (loaded only then) lend the rest (one slot when one can, the next
    after its own in slot order; else several, fullest first), each charged in the same save. Refused only when all K slots together cannot pay: then the wait is
    computed over the sum (each slot refills at R/K up to C/K).

    The sum of the slots is never more than the single bucket would hold, and equal to it
    while no slot is full: a slot's refill above its share is lost while another is empty
    (the price of not writing one stream from every replica; ADR-0023)."""

    def __init__(self, own: TenantQuotaSlot, others: Callable[[], Sequence[TenantQuotaSlot]]) -> None:
        self.own = own
        self._others = others
        self._loaded: list[TenantQuotaSlot] | None = None
        self.charged: list[TenantQuotaSlot] = []  # the slots the charge wrote to (to save)

    def _all(self) -> list[TenantQuotaSlot]:
        if self._loaded is None:
            self._loaded = [self.own, *(s for s in self._others() if s is not self.own)]
        return self._loaded

    def retry_after(self, entries: int, now: float, params: Parameters) -> float:
        if entries > params.tenant_fanout_quota_capacity:
            return math.inf
        if self.own.level(params, now).retry_after(entries, now) == 0.0:
            return 0.0
        levels = [s.level(params, now) for s in self._all()]
        refill = levels[0].refill_per_sec
        return sum_retry_after(
            [b.available(now) for b in levels],
            levels[0].capacity,
            refill,
            entries,
            slack=1e-9 + refill * len(levels) * 4 * math.ulp(now),  # as TokenBucket.retry_after forgives
        )

    def _lenders(
        self, others: Sequence[TenantQuotaSlot], avail: dict[int, float], rest: float
    ) -> list[TenantQuotaSlot]:
        """The other slots in the order they lend `rest`: first one that can lend it all
        alone, the next such slot after this replica's own in slot order (replicas that all
        borrow at once then lean on different slots instead of all racing for the fullest
        one: each save touches two slot streams, not every replica the same one), then the
        others fullest first (several lend only when none can alone)."""
        k, n = self.own.slot, self.own.slots
        alone = sorted((s for s in others if avail[id(s)] >= rest), key=lambda s: (s.slot - k) % n)
        if alone:
            return [alone[0]]
        return sorted(others, key=lambda s: -avail[id(s)])

    def charge(self, entries: int, conversation_id: str, params: Parameters, now: float) -> None:
        own = self.own.level(params, now)
        if own.retry_after(entries, now) == 0.0:
            self.own.take(entries, conversation_id, params, now)
            self.charged = [self.own]
            return
        slots = self._all()
        left = float(entries)
        avail = {id(s): s.level(params, now).available(now) for s in slots}
        rest = left - max(0.0, avail[id(self.own)])
        order = [self.own, *self._lenders(slots[1:], avail, rest)]
        self.charged = []
        for i, slot in enumerate(order):
            last = i == len(order) - 1
            part = left if last else min(left, max(0.0, avail[id(slot)]))
            if part <= 0.0:
                continue
            slot.take(part, conversation_id, params, now)
            self.charged.append(slot)
            left -= part
            if left <= 0.0:
                break


def sum_retry_after(
    available: Sequence[float], capacity: float, refill: float, cost: float, slack: float = 1e-9
) -> float:
    """Seconds until K buckets (each `capacity`, refilling at `refill`, now holding
    `available`) hold `cost` tokens together; 0.0 if they do now (within `slack`)."""
    total = sum(available)
    missing = cost - total
    if missing <= slack:
        return 0.0
    if cost > capacity * len(available) + 1e-9:
        return math.inf
    # Each bucket refills at `refill` until it is full: the sum is piecewise linear in time.
    to_full = sorted(max(0.0, (capacity - a) / refill) for a in available)
    t = 0.0
    rising = len(available)
    for stop in to_full:
        gain = (stop - t) * refill * rising
        if gain >= missing:
            return t + missing / (refill * rising)
        missing -= gain
        t = stop
        rising -= 1
    # Every bucket is full at t and they hold the cost (checked above): what is still
    # "missing" is rounding (a cost of exactly K x capacity; hypothesis found it returning inf).
    return t
