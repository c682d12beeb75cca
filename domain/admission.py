"""Admission gates (ADR decision 6): token buckets, pure and deterministic.

A bucket's state is part of aggregate state and is advanced only by applying
events, so a restart replays it exactly and never hands out a fresh burst."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class TokenBucket:
    capacity: float
    refill_per_sec: float
    tokens: float
    updated_at: float

    @classmethod
    def full(cls, capacity: float, refill_per_sec: float, now: float) -> TokenBucket:
        return cls(capacity, refill_per_sec, capacity, now)

    @classmethod
    def resume(cls, state: list[float] | None, capacity: float, refill_per_sec: float, now: float) -> TokenBucket:
        """The bucket as stored (full if never used), under the capacity and refill in
        force now: a size class or a setting may have changed since it was saved."""
        if state is None:
            return cls.full(capacity, refill_per_sec, now)
        b = cls.from_state(state)
        b.capacity, b.refill_per_sec = capacity, refill_per_sec
        return b

    def available(self, now: float) -> float:
        elapsed = max(0.0, now - self.updated_at)
        return min(self.capacity, self.tokens + elapsed * self.refill_per_sec)

    def retry_after(self, cost: float, now: float) -> float:
        """Seconds until `cost` tokens are available; 0.0 if they are now.

        A cost above capacity can never be paid: it returns math.inf."""
        if cost > self.capacity:
            return math.inf
        missing = cost - self.available(now)
        # `now - updated_at` carries about one ulp of `now` of float error: forgive what
        # a few ulps of refill amount to, so trying again at now + wait succeeds.
        if missing <= 1e-9 + self.refill_per_sec * 4 * math.ulp(now):
            return 0.0
        return missing / self.refill_per_sec

    def take(self, cost: float, now: float) -> None:
        """Spend `cost` tokens at `now` (called from an event's apply)."""
        self.tokens = self.available(now) - cost
        self.updated_at = max(now, self.updated_at)

    @classmethod
    def charged(
        cls, state: list[float] | None, cost: float, capacity: float, refill_per_sec: float, now: float
    ) -> list[float]:
        """The stored bucket after `cost` tokens were spent at `now` (a Charged event's apply)."""
        b = cls.resume(state, capacity, refill_per_sec, now)
        b.take(cost, now)
        return b.to_state()

    def to_state(self) -> list[float]:
        return [self.capacity, self.refill_per_sec, self.tokens, self.updated_at]

    @classmethod
    def from_state(cls, s: list[float]) -> TokenBucket:
        return cls(*s)


def retry_after_ms(seconds: float) -> int:
    """The retry hint, rounded up, plus 1 ms: epoch-sized timestamps carry ~0.2 us of
    float error, and a client retrying exactly at the hint must be admitted."""
    if math.isinf(seconds):
        return -1
    return math.ceil(seconds * 1000) + 1
