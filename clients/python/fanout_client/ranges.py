"""Sets of conversation seqs kept as sorted, merged `[first, last]` ranges: what a client
holds of a conversation, and what it knows it lacks."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator

Range = tuple[int, int]


class RangeSet:
    """Sorted, disjoint, non-adjacent inclusive ranges; adding only ever grows it."""

    def __init__(self, ranges: Iterable[Iterable[int]] = ()) -> None:
        self._ranges: list[list[int]] = []
        for first, last in ranges:
            self.add_range(first, last)

    def add(self, seq: int) -> bool:
        """Add one seq; True when it was not held before (the de-duplication test)."""
        if seq in self:
            return False
        self.add_range(seq, seq)
        return True

    def add_range(self, first: int, last: int) -> None:
        if first > last:
            return
        merged = [first, last]
        kept: list[list[int]] = []
        for r in self._ranges:
            if r[1] + 1 < merged[0] or r[0] - 1 > merged[1]:
                kept.append(r)
            else:
                merged = [min(r[0], merged[0]), max(r[1], merged[1])]
        kept.append(merged)
        kept.sort()
        self._ranges = kept

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        i = bisect_right(self._ranges, [seq, float("inf")]) - 1
        return i >= 0 and self._ranges[i][0] <= seq <= self._ranges[i][1]

    def __iter__(self) -> Iterator[Range]:
        return ((r[0], r[1]) for r in self._ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and self._ranges == other._ranges

    def __repr__(self) -> str:
        return f"RangeSet({self.as_lists()})"

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def lowest(self) -> int | None:
        return self._ranges[0][0] if self._ranges else None

    def highest(self) -> int | None:
        return self._ranges[-1][1] if self._ranges else None

    def missing(self, first: int, last: int) -> list[Range]:
        """The ranges of [first, last] not held."""
        out: list[Range] = []
        at = first
        for lo, hi in self._ranges:
            if hi < at:
                continue
            if lo > last:
                break
            if lo > at:
                out.append((at, lo - 1))
            at = max(at, hi + 1)
        if at <= last:
            out.append((at, last))
        return out

    def as_lists(self) -> list[list[int]]:
        return [list(r) for r in self._ranges]
