"""The one fake clock: the domain never reads time, it is handed `now`; the runtime
reads it from a clock callable, which tests and the demo replace with this one."""

from __future__ import annotations


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
