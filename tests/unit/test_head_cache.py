"""The replica's head cache (projections/head_cache.py, ADR-0035) against a model of the views,
the workers' commit records and the replica's reads: whatever the interleaving (records late or
lost, reads that straddle commits, resets, time passing), a head the cache serves is never
older than the views were at the highest position the replica had learned of that head's
partition, from a record or from a read of the views. With every record delivered and the
replica's view of the positions up to date, the cache serves exactly the views."""

from __future__ import annotations

from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from projections.head_cache import FILL_WINDOW, LOST_AFTER, HeadCache
from projections.hosting import ViewsTracked
from projections.state import SessionHead

T = "acme"
CONVERSATIONS = {f"c{i}": i % 2 for i in range(6)}  # conversation -> its log partition
PARTITIONS = 2


def head(cid: str, version: int) -> SessionHead:
    return SessionHead(cid, "always", version, 0, f"m{version}", float(version), f"text {version}")


class HeadCacheMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.now = 0.0
        self.cache = HeadCache(PARTITIONS, capacity=4, max_age=50.0, clock=lambda: self.now)
        self.position = 0  # the log's last position (global, like the event store's)
        self.views = {p: 0 for p in range(PARTITIONS)}  # partition -> position the views hold
        self.version = dict.fromkeys(CONVERSATIONS, 0)  # the views' heads
        self.history: dict[str, list[tuple[int, int]]] = {c: [(0, 0)] for c in CONVERSATIONS}
        self.in_flight: deque[ViewsTracked] = deque()  # records published, not yet received
        self.learned = {p: 0 for p in range(PARTITIONS)}  # what the replica learned, per partition
        self.reads: list[tuple[object, dict[str, int] | None]] = []  # (ticket, what the read returned)
        self.cache.establish(dict(self.views))

    # -- the workers -----------------------------------------------------------------------

    @rule(
        partition=st.integers(0, PARTITIONS - 1),
        touched=st.sets(st.sampled_from(sorted(CONVERSATIONS)), max_size=3),
        lost=st.booleans(),
    )
    def commit(self, partition: int, touched: set[str], lost: bool) -> None:
        mine = sorted(c for c in touched if CONVERSATIONS[c] == partition)
        self.position += 1
        since = self.views[partition]
        self.views[partition] = self.position
        for c in mine:
            self.version[c] += 1
            self.history[c].append((self.position, self.version[c]))
        if not lost:
            self.in_flight.append(ViewsTracked({partition: self.position}, {partition: since}, tuple((T, c) for c in mine)))

    @precondition(lambda self: self.in_flight)
    @rule()
    def record_arrives(self) -> None:
        t = self.in_flight.popleft()
        self.cache.on_tracked(t)
        for p, pos in t.positions.items():
            self.learned[p] = max(self.learned[p], pos)

    @rule(partition=st.integers(0, PARTITIONS - 1))
    def replica_reads_a_position(self, partition: int) -> None:
        pos = self.views[partition]
        self.cache.saw({partition: pos})
        self.learned[partition] = max(self.learned[partition], pos)

    @rule()
    def replica_reads_the_lowest_position(self) -> None:
        low = min(self.views.values())
        self.cache.saw(every=low)
        for p in self.learned:
            self.learned[p] = max(self.learned[p], low)

    @rule(seconds=st.sampled_from([0.1, 1.0, LOST_AFTER, FILL_WINDOW + 1]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    # -- the logins ------------------------------------------------------------------------

    @rule(ids=st.lists(st.sampled_from(sorted(CONVERSATIONS)), min_size=1, max_size=6, unique=True))
    def login_begins(self, ids: list[str]) -> None:
        found, ticket = self.cache.get_many(T, ids)
        for cid, h in found.items():
            self.check_served(cid, h)
        self.reads.append((ticket, None))

    @precondition(lambda self: any(r is None for _, r in self.reads))
    @rule(data=st.data())
    def the_read_reaches_the_views(self, data: st.DataObject) -> None:
        waiting = [i for i, (_, r) in enumerate(self.reads) if r is None]
        i = data.draw(st.sampled_from(waiting))
        self.reads[i] = (self.reads[i][0], dict(self.version))

    @precondition(lambda self: any(r is not None for _, r in self.reads))
    @rule(data=st.data())
    def the_read_fills(self, data: st.DataObject) -> None:
        done = [i for i, (_, r) in enumerate(self.reads) if r is not None]
        ticket, read = self.reads.pop(data.draw(st.sampled_from(done)))
        assert read is not None
        self.cache.fill(ticket, T, [head(c, v) for c, v in read.items()])  # type: ignore[arg-type]

    def check_served(self, cid: str, h: SessionHead) -> None:
        known = self.learned[CONVERSATIONS[cid]]
        at_known = max(v for pos, v in self.history[cid] if pos <= known)
        assert h.latest_conversation_seq >= at_known, (
            f"{cid}: served version {h.latest_conversation_seq}, but the replica knew of position {known} "
            f"where the views held version {at_known}"
        )

    @invariant()
    def quiescent_means_exact(self) -> None:
        """Records all in, the replica's positions up to date: every head served is the views'."""
        if self.in_flight or any(self.learned[p] < self.views[p] for p in self.views):
            return
        found, _ = self.cache.get_many(T, sorted(CONVERSATIONS))
        for cid, h in found.items():
            assert h.latest_conversation_seq == self.version[cid]


HeadCacheMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=60, deadline=None)
test_the_head_cache_never_serves_a_head_older_than_what_the_replica_knew = HeadCacheMachine.TestCase


def test_a_login_after_a_commit_record_reads_the_new_head_and_the_next_login_hits() -> None:
    now = [0.0]
    cache = HeadCache(1, clock=lambda: now[0])
    cache.establish({0: 10})
    _, ticket = cache.get_many(T, ["a", "b"])
    assert cache.fill(ticket, T, [head("a", 1), head("b", 1)]) == 2
    found, _ = cache.get_many(T, ["a", "b"])
    assert found == {"a": head("a", 1), "b": head("b", 1)}
    cache.on_tracked(ViewsTracked({0: 11}, {0: 10}, ((T, "a"),)))
    found, _ = cache.get_many(T, ["a", "b"])
    assert found == {"b": head("b", 1)} and cache.stats.resets == 0


def test_a_record_that_skips_a_commit_drops_everything() -> None:
    cache = HeadCache(1)
    cache.establish({0: 10})
    _, ticket = cache.get_many(T, ["a"])
    cache.fill(ticket, T, [head("a", 1)])
    cache.on_tracked(ViewsTracked({0: 13}, {0: 12}, ()))  # the record of 10 -> 12 never came
    assert cache.get_many(T, ["a"])[0] == {} and cache.stats.resets == 1


def test_nothing_is_served_before_the_chains_start_nor_while_a_position_is_ahead_of_them() -> None:
    now = [0.0]
    cache = HeadCache(2, clock=lambda: now[0])
    _, ticket = cache.get_many(T, ["a"])
    assert cache.fill(ticket, T, [head("a", 1)]) == 0  # not established
    cache.establish({0: 5, 1: 7})
    _, ticket = cache.get_many(T, ["a"])
    cache.fill(ticket, T, [head("a", 1)])
    cache.saw({1: 9})  # the views of partition 1 stand at 9; its record is not here yet
    assert cache.get_many(T, ["a"])[0] == {} and cache.stats.bypassed == 1
    cache.on_tracked(ViewsTracked({1: 9}, {1: 7}, ()))
    assert cache.get_many(T, ["a"])[0] == {"a": head("a", 1)}
    cache.saw({0: 6})  # and this record is lost: after LOST_AFTER everything goes
    now[0] += LOST_AFTER / 2
    assert cache.get_many(T, ["a"])[0] == {}
    now[0] += LOST_AFTER
    assert cache.get_many(T, ["a"])[0] == {} and cache.stats.resets == 1
    _, ticket = cache.get_many(T, ["a"])
    cache.fill(ticket, T, [head("a", 2)])
    assert cache.get_many(T, ["a"])[0] == {"a": head("a", 2)}  # the chain restarted at 6


def test_a_read_that_a_record_overtook_fills_nothing_of_that_head() -> None:
    cache = HeadCache(1)
    cache.establish({0: 1})
    _, ticket = cache.get_many(T, ["a", "b"])
    cache.on_tracked(ViewsTracked({0: 2}, {0: 1}, ((T, "a"),)))  # while the read was out
    assert cache.fill(ticket, T, [head("a", 0), head("b", 0)]) == 1
    assert cache.get_many(T, ["a", "b"])[0] == {"b": head("b", 0)}
