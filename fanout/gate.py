"""The per-user gate for user commands (MARK_READ, REBUILD): a token bucket per
(tenant, user), kept in this process (ADR-0009). It guards the shared log against one
token's flood; unlike the send gates (ADR-0005) it is not an event-sourced contract,
so a restart starts every bucket full."""

from __future__ import annotations

import threading

from domain.admission import TokenBucket, retry_after_ms
from domain.errors import RateLimited
from domain.params import Parameters

GATE = "per_user_command_rate"


class UserCommandGate:
    # Buckets that are full again are forgotten once there are more than this many.
    MAX_BUCKETS = 100_000

    def __init__(self, params: Parameters) -> None:
        self.capacity = params.per_user_command_burst
        self.rate = params.per_user_command_rate
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._lock = threading.Lock()

    def admit(self, tenant: str, user_id: str, now: float) -> None:
        """Spend one token of this user's bucket, or raise RateLimited (nothing spent)."""
        key = (tenant, user_id)
        with self._lock:
            bucket = self._buckets.get(key) or TokenBucket.full(self.capacity, self.rate.per_second, now)
            wait = bucket.retry_after(1, now)
            if wait > 0:
                raise RateLimited(
                    f"{user_id} may send {self.rate.count:g} user commands / {self.rate.per_seconds:g} s "
                    f"(burst {self.capacity:g})",
                    gate=GATE,
                    retry_after_ms=retry_after_ms(wait),
                )
            bucket.take(1, now)
            self._buckets[key] = bucket
            if len(self._buckets) > self.MAX_BUCKETS:
                self._buckets = {k: b for k, b in self._buckets.items() if b.available(now) < b.capacity}
