"""An API replica's cache of conversation heads for the login (ADR-0035), kept exact by the
workers' commit records.

A login of a user in 5,000 conversations reads 5,000 heads: 5,000 Cassandra partitions, about
110 us of Cassandra's CPU each on this machine whatever the read's shape (docs/PERFORMANCE.md
section 17). The heads a replica read are kept here and served again until a worker's commit
changes them: each unit of work publishes, after it commits, a `ViewsTracked` record with the
heads it wrote and, per log partition, the position the views stood at before it (`since`)
and after it (`positions`). The replica hands each record to `on_tracked`, which drops those
heads.

Three rules keep a served head from being older than what the records have said:

* **A chain per log partition.** `establish` starts it from the positions the views hold,
  read after the subscriber fixed where it reads from (so every later commit's record
  reaches it). A record whose `since` is not where the chain stands means a record was lost
  (a worker killed between its commit and its publish), another writer overlapped (a
  fenced one), or the views went back (healed after a Cassandra crash): everything cached
  is dropped and the chain restarts there. A record at or below the chain is one the
  positions already covered.
* **Never behind what a reader was told.** `saw` gets every position the replica learns the
  views hold (its watcher's reads, a waited-on partition's read) before a reader waiting on it
  wakes; while a partition's chain stands below what was seen (its record on the way, or lost,
  perhaps with none after it on an idle partition) no head is served, and after LOST_AFTER
  seconds everything cached is dropped and that chain restarts at what was seen.
* **Fills never resurrect.** A read started before a record dropped a head could return it
  as it was: `fill` keeps a head only if no record named it since the read began, the cache
  was not reset meanwhile, and the read took less than FILL_WINDOW.

A backstop for what publishes no record (the views swapped after a rebuild): an entry is
served for at most `max_age` seconds. Pure and thread-safe; no I/O.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from projections.hosting import ViewsTracked
from projections.state import SessionHead

LOST_AFTER = 2.0  # seconds a partition may stand above its chain with no record before it counts as lost
FILL_WINDOW = 30.0  # seconds: a read that took longer fills nothing, and records are remembered this long
MAX_AGE = 300.0  # seconds an entry is served at most (views swapped by a rebuild publish no record)
CAPACITY = 200_000  # heads kept (least recently used dropped first); ~0.4 KiB each

Key = tuple[str, str]  # (tenant, conversation_id)


@dataclass(frozen=True)
class Ticket:
    """What a fill needs to know of when its read began."""

    generation: int
    started: float


@dataclass
class HeadCacheStats:
    hits: int = 0
    misses: int = 0
    dropped: int = 0  # entries dropped because a record named their head
    resets: int = 0  # everything dropped: a chain broke, a record was lost
    fills_refused: int = 0
    bypassed: int = 0  # logins served no cached head: a chain stood below a position seen


class HeadCache:
    def __init__(
        self,
        partitions: int,
        *,
        capacity: int = CAPACITY,
        max_age: float = MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.partitions = partitions
        self.capacity = capacity
        self.max_age = max_age
        self.clock = clock
        self.stats = HeadCacheStats()
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, tuple[SessionHead, float]] = OrderedDict()  # (head, filled at)
        self._named: dict[Key, float] = {}  # heads a record named, when (kept FILL_WINDOW)
        self._named_order: deque[tuple[float, Key]] = deque()
        self._chain: dict[int, int] | None = None  # None: not established, nothing is cached
        self._seen: dict[int, int] = {}  # partition -> the highest position the replica learned the views hold
        self._seen_every = 0  # a position every partition's views hold at least (the replica learned)
        self._ahead: dict[int, tuple[int, float]] = {}  # partition -> (its chain, since when it stands below _seen)
        self._generation = 0

    @property
    def ready(self) -> bool:
        return self._chain is not None

    def __len__(self) -> int:
        return len(self._entries)

    # -- what the workers and the views say ------------------------------------------------

    def establish(self, positions: Mapping[int, int]) -> None:
        """Start every partition's chain at the views' positions (read after the subscriber
        fixed its start): from here on every commit's record reaches `on_tracked`."""
        with self._lock:
            self._reset(counted=False)
            self._chain = {p: positions.get(p, 0) for p in range(self.partitions)}

    def on_tracked(self, t: ViewsTracked) -> None:
        now = self.clock()
        with self._lock:
            for key in t.heads:
                if self._entries.pop(key, None) is not None:
                    self.stats.dropped += 1
                self._named[key] = now
                self._named_order.append((now, key))
            self._forget_named(now)
            if self._chain is None:
                return
            for p, to in t.positions.items():
                at = self._chain.get(p, 0)
                if to <= at:
                    continue  # a commit the chain's start (or a later record) already covered
                if t.since.get(p) != at:
                    self._reset()
                self._chain[p] = to
                self._ahead.pop(p, None)

    def saw(self, positions: Mapping[int, int] = {}, *, every: int = 0) -> None:  # noqa: B006 (read only)
        """Positions the replica learned the views hold (read from them, or from a record),
        `every` a position all partitions hold at least: call it BEFORE a reader waiting for
        them is woken. No head is served while a partition's chain stands below what was
        seen (a record on its way, or lost): a reader that waited for a position never gets
        a head older than it."""
        with self._lock:
            self._seen_every = max(self._seen_every, every)
            seen = self._seen
            for p, pos in positions.items():
                if pos > seen.get(p, 0):
                    seen[p] = pos

    # -- what the login reads -----------------------------------------------------------

    def get_many(self, tenant: str, conversation_ids: Sequence[str]) -> tuple[dict[str, SessionHead], Ticket]:
        """The cached heads among these, and the ticket a fill of the others needs."""
        now = self.clock()
        found: dict[str, SessionHead] = {}
        with self._lock:
            if self._chain is not None and self._behind(now):
                self.stats.bypassed += 1
            elif self._chain is not None:
                self._serve(tenant, conversation_ids, now, found)
            ticket = Ticket(self._generation, now)
            self.stats.hits += len(found)
            self.stats.misses += len(conversation_ids) - len(found)
        return found, ticket

    def _serve(self, tenant: str, conversation_ids: Sequence[str], now: float, found: dict[str, SessionHead]) -> None:
        entries = self._entries
        for cid in conversation_ids:
            key = (tenant, cid)
            e = entries.get(key)
            if e is None:
                continue
            if now - e[1] > self.max_age:
                del entries[key]
                continue
            entries.move_to_end(key)
            found[cid] = e[0]

    def fill(self, ticket: Ticket, tenant: str, heads: Iterable[SessionHead]) -> int:
        """Keep the heads a read begun at `ticket` returned, unless something since says
        they may be old; returns how many were kept."""
        now = self.clock()
        kept = 0
        with self._lock:
            if self._chain is None or ticket.generation != self._generation or now - ticket.started > FILL_WINDOW:
                self.stats.fills_refused += 1
                return 0
            named = self._named
            for h in heads:
                key = (tenant, h.conversation_id)
                when = named.get(key)
                if when is not None and when >= ticket.started:
                    continue
                self._entries[key] = (h, ticket.started)
                self._entries.move_to_end(key)
                kept += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return kept

    # -- inside the lock ------------------------------------------------------------------

    def _behind(self, now: float) -> bool:
        """Whether a partition's chain stands below what was seen; one that has for
        LOST_AFTER seconds lost a record: everything is dropped and its chain restarts
        at what was seen (a position the views held, read after the subscriber started)."""
        assert self._chain is not None
        behind = False
        for p, at in self._chain.items():
            need = max(self._seen.get(p, 0), self._seen_every)
            if at >= need:
                self._ahead.pop(p, None)
                continue
            behind = True
            since = self._ahead.get(p)
            if since is None or since[0] != at:
                self._ahead[p] = (at, now)
            elif now - since[1] >= LOST_AFTER:
                self._reset()
                self._chain[p] = need
        return behind

    def _reset(self, counted: bool = True) -> None:
        self._entries.clear()
        self._ahead.clear()
        self._generation += 1
        if counted:
            self.stats.resets += 1

    def _forget_named(self, now: float) -> None:
        order = self._named_order
        while order and now - order[0][0] > FILL_WINDOW:
            when, key = order.popleft()
            if self._named.get(key) == when:
                del self._named[key]
