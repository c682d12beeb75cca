"""An API replica's clock against the event store's (ADR-0041).

A send is stamped with the clock of the replica that accepts it (`MessageRefs.at`), and the
Cassandra mailbox files each entry under the hour of that stamp (ADR-0038). A cursor read
finds a user's entries by walking the tenant's hours and assumes that a message of hour h
comes after every message of hour h - MARGIN - 1 (adapters/cassandra/mailbox.py): replicas
whose clocks are an hour or more apart would file later messages in hours the read has
already passed, and the read would silently return a page with entries missing. Here that
assumption is enforced: each replica measures its clock against PostgreSQL's (the one clock
every replica shares) when it starts and at every health check, and while the difference is
over `Parameters.max_clock_skew` (5 minutes by default, so two replicas are at most 10 minutes
apart) it refuses the writes it would stamp, UNAVAILABLE with reason `clock_skew`, and
/readyz says not ready. A store that does not answer leaves the last measurement as it was:
the store's own failures are refused elsewhere."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from domain.errors import Unavailable

log = logging.getLogger("fanout.clock_guard")

RETRY_MS = 30_000  # a clock is put right by an operator (or NTP's next step), not in a moment


class ClockGuard:
    """`reference()`: the event store's time (seconds since the epoch); `clock()`: the one this
    replica stamps sends with; `bound`: the largest difference (seconds) it writes with."""

    def __init__(self, reference: Callable[[], float], clock: Callable[[], float], bound: float) -> None:
        if bound <= 0:
            raise ValueError("a clock guard needs a positive bound (0 turns the check off: build none)")
        self.reference = reference
        self.clock = clock
        self.bound = bound
        self.skew: float | None = None  # this replica's clock minus the store's, at the last measurement
        self.refusals = 0
        self._lock = threading.Lock()

    def measure(self) -> float | None:
        """Read the store's time between two readings of this replica's clock: their midpoint
        minus it is the skew, to within half the round trip. None when the store did not answer."""
        try:
            before = self.clock()
            theirs = self.reference()
            after = self.clock()
        except Exception as exc:  # the store's failures are reported and refused by their own checks
            log.debug("clock guard: the event store's time was not read (%s)", exc)
            return None
        skew = (before + after) / 2 - theirs
        with self._lock:
            was_over = self.over(self.skew)
            self.skew = skew
        if self.over(skew) and not was_over:
            log.error("%s", self.describe(skew))
        elif was_over and not self.over(skew):
            log.warning(
                "clock guard: this replica's clock is %.1f s off the event store's again: writes accepted", skew
            )
        return skew

    def over(self, skew: float | None) -> bool:
        return skew is not None and abs(skew) > self.bound

    def describe(self, skew: float) -> str:
        side = "ahead of" if skew > 0 else "behind"
        return (
            f"this replica's clock is {abs(skew):,.0f} s {side} the event store's (PostgreSQL), more than the "
            f"{self.bound:,.0f} s FANOUT_MAX_CLOCK_SKEW allows: messages stamped with it would be filed under hours "
            "the views' cursor reads do not look in. Synchronize this host's clock (NTP)"
        )

    def check(self) -> None:
        """Raise Unavailable while the last measurement is over the bound (no query: O(1))."""
        skew = self.skew
        if self.over(skew):
            assert skew is not None
            self.refusals += 1
            raise Unavailable(
                f"not accepted: {self.describe(skew)}; retry later or through another replica",
                reason="clock_skew",
                clock_skew_seconds=round(skew, 3),
                retry_after_ms=RETRY_MS,
            )
