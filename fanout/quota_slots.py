"""The tenant's fan-out bucket as the commands load it (ADR-0023).

One writer per event store (the embedded runtime) charges one `TenantQuota` stream per
tenant. Replicas of a shared store would race on that one stream, so there the bucket is K
`TenantQuotaSlot` streams: a replica charges its own slot, and borrows from the others (read
fresh) only when its own cannot pay (`domain/quota.py` `SlottedQuota`). A replica starts on
the slot its id hashes to, and moves to another one at random when a save charging a slot
lost a race (two replica ids may hash alike)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable
from typing import Protocol, TypeVar
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain.errors import NotFound
from domain.quota import Quota, SlottedQuota, TenantQuota, TenantQuotaSlot

A = TypeVar("A", bound=Aggregate)


class Find(Protocol):
    """`CommandUnit._find`: the caller's aggregate of an id, or None."""

    def __call__(
        self, cls: type[A], aggregate_id: UUID, tenant: str, what: str, *, saves: bool = False, monotone: bool = False
    ) -> A | None: ...


def slot_of(replica_id: str, slots: int) -> int:
    """The quota slot a replica starts charging: CRC-32 of its id modulo the slots."""
    return zlib.crc32(replica_id.encode()) % slots if slots else 0


class QuotaSlots:
    """The tenants' buckets of one application: `slots` streams each (0: one TenantQuota
    stream), this replica charging `slot`; `moves` counts its moves to another slot."""

    def __init__(self, find: Find, slots: int, replica_id: str) -> None:
        self._find = find
        self.slots = slots
        self.replica_id = replica_id
        self.slot = slot_of(replica_id, slots)
        self.moves = 0

    def quota(self, tenant: str) -> Quota:
        """The tenant's bucket, for a command about to charge it (loaded without the
        fast-forward query on a shared store: a token bucket's stale copy holds at least the
        fresh one's tokens, see `_find`'s `monotone`)."""
        if not self.slots:
            q = self._find(TenantQuota, TenantQuota.create_id(tenant), tenant, "tenant quota", saves=True)
            return q if q is not None else TenantQuota(tenant=tenant)
        own = self._slot(tenant, self.slot, cached=True)
        # The other slots are read only when this one cannot pay, and then fast-forwarded:
        # other replicas charge them (and borrow from them), so a cached copy is likely stale
        # then, and a save on it would lose the race.
        return SlottedQuota(own, lambda: [self._slot(tenant, k) for k in range(self.slots) if k != self.slot])

    def _slot(self, tenant: str, k: int, *, cached: bool = False) -> TenantQuotaSlot:
        slot = self._find(
            TenantQuotaSlot, TenantQuotaSlot.create_id(tenant, k), tenant, "tenant quota", saves=cached, monotone=True
        )
        if slot is not None:
            if slot.slot != k or slot.slots != self.slots:
                raise NotFound("tenant quota not found")  # unreachable: the id is derived from them
            return slot
        legacy = self._find(TenantQuota, TenantQuota.create_id(tenant), tenant, "tenant quota")
        return TenantQuotaSlot(tenant=tenant, slot=k, slots=self.slots, bucket=TenantQuotaSlot.seed(legacy, self.slots))

    def lost_race(self, aggregates: Iterable[object]) -> None:
        """A save of these lost a race: if it charged a slot, another replica may charge the
        same one. Move to another slot at random, so replicas of one tenant spread over the
        slots instead of racing on one."""
        if self.slots > 1 and any(isinstance(a, TenantQuotaSlot) for a in aggregates):
            self.slot = (self.slot + random.randrange(1, self.slots)) % self.slots  # noqa: S311
            self.moves += 1
