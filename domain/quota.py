"""TenantQuota: the tenant fan-out token bucket, charged with mailbox entries."""

from __future__ import annotations

from typing import Any
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
        b = TokenBucket.resume(self.bucket, capacity, refill_per_sec, at)
        b.take(entries, at)
        self.bucket = b.to_state()
        self.charged_total += entries
