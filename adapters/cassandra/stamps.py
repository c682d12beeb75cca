"""Write timestamps from log positions: how a stale writer is fenced on Cassandra
(docs/adr/0021-fencing-by-log-position.md).

Cassandra resolves two writes of one cell by their write timestamp (last write wins), not by
the order they arrive. Every write the projections make carries `USING TIMESTAMP` derived
from the log position of what it describes, so the views order by the log, not by wall
clocks or by who wrote last: a worker paused mid-unit that wakes after its partition moved
writes rows older than the ones already there, and they lose. A tracking position can only
go forward, by the same rule.

    stamp(position, rank) = BASE + position * STEP + rank

* BASE = 2**52 us (year 2112): above any wall-clock stamp (~1.7e15 us in 2026), so a row
  written by an earlier version (driver stamps) never outranks a fenced write.
* STEP = 4 ranks per position: RANK_UNIT (0) for the units of work, RANK_REBUILD (2) for
  `fanout rebuild`'s merge of views built up to position P: it replaces every row written
  at or before P and loses to every unit after P (a rebuild racing a live worker).

Writes that are not derived from the log (the replicas' push counts, the capacity monitor's
memo, which uses a lightweight transaction) keep the driver's wall-clock stamps, in rows no
projection writes."""

from __future__ import annotations

BASE = 1 << 52
STEP = 4
RANK_UNIT = 0
RANK_REBUILD = 2


def stamp(position: int, rank: int = RANK_UNIT) -> int:
    """The write timestamp (microseconds) of a write derived from log `position`."""
    if position < 0:
        raise ValueError(f"a log position is >= 0, got {position}")
    return BASE + position * STEP + rank
