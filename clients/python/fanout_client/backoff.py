"""The one backoff schedule of the client: full jitter, doubling from `base` up to `cap`;
a server's retry hint (Retry-After, details.retry_after_ms) is a floor under it."""

from __future__ import annotations

import random

BASE = 0.25
CAP = 30.0


def backoff_delay(attempt: int, rng: random.Random, base: float = BASE, cap: float = CAP) -> float:
    """Seconds to wait before retry number `attempt` (0 first): uniform in [0, min(cap, base * 2**attempt)],
    so many clients dropped at once do not come back at once."""
    return rng.uniform(0.0, min(cap, base * (2 ** min(attempt, 30))))


def retry_delay(hint: float | None, attempt: int, rng: random.Random) -> float:
    """After a refusal: the server's hint plus up to 10 % of jitter, or the backoff without one."""
    if hint is None:
        return backoff_delay(attempt, rng)
    return hint + rng.uniform(0.0, max(0.05, hint * 0.1))
