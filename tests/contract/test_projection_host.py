"""The projection host (streams/host.py) written once, run against every view-store backend
and fed by every kind of log it serves (ADR-0029):

* the event store's notification log, as the embedded runner and the rebuild read it
  (`EmbeddedRunner`, takes of 1, 7 and 500 events);
* Kafka-shaped takes, as a worker receives them: each conversation's events routed to its
  partition as the relay routes them, every partition ending with a watermark, and each take
  mixing several partitions (sends, joins, leaves, MARK_READ, REBUILD and a review of a dozen
  conversations of two tenants in one unit of work);
* either of those with a unit that dies at every step of its commit (Cassandra's rounds:
  mailbox, rows, heads, tracking; a SQLite or in-memory unit, one transaction, dies before
  it commits) and is retried with the same records, as a worker's Applier does.

Each must give exactly the views of the naive reference: every event folded alone, in log
order, by freshly built projections with no host at all."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from adapters.memory import MemoryViews
from fanout.bootstrap import open_views
from projections import failpoints
from projections.delivery import Delivered
from projections.hosting import build_projections
from projections.ports import ViewStore
from streams.embedded import EmbeddedRunner
from streams.host import Record
from streams.records import EventRecord
from tests.contract.test_view_store import OnCassandra
from tests.host_log import PARAMS, PARTITIONS, LogBuilder, host_for, partitioned, snapshot, written_log


class Crash(Exception):
    """The process died at this step of a unit of work."""


@pytest.fixture(scope="module")
def log() -> Iterator[LogBuilder]:
    with written_log() as b:
        yield b


def naive(b: LogBuilder, views: Any) -> None:
    """Every event alone in its own unit of work, in log order, no host."""
    projections = build_projections(views, PARAMS)
    for n in b.notes():
        event = b.app.mapper.to_domain_event(n)
        with views.unit_of_work() as w:
            for p in projections:
                if type(event) in p.topics:
                    p.process(event, n.id, w)
            for p in projections:
                p.flush(w)
                w.track(p.name, n.id)


@pytest.fixture(scope="module")
def reference(log: LogBuilder) -> dict[str, Any]:
    views = MemoryViews()
    naive(log, views)
    return snapshot(views)


def takes(by_partition: dict[int, list[Record]], size: int) -> Iterator[dict[int, list[Record]]]:
    """Takes of up to `size` records from each partition at once, in turn, as a consumer
    fetching from every partition it holds would hand them over."""
    at = dict.fromkeys(by_partition, 0)
    while any(at[p] < len(rs) for p, rs in by_partition.items()):
        take = {}
        for p, rs in by_partition.items():
            if at[p] < len(rs):
                take[p] = rs[at[p] : at[p] + size]
                at[p] += size
        yield take


class Dies:
    """Arms one crash: at `step` of the `unit`-th unit of work ('body': in the unit, before
    its commit; any other: the store's commit step of that name, through the host's
    checkpoint). The crash fires once; the retry goes through."""

    def __init__(self, views: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.views = views
        self.unit = 0
        self.target: tuple[int, str] | None = None
        self.fired: list[tuple[int, str]] = []
        original = failpoints.hit

        def hit(name: str, labels: Any = ()) -> None:
            self._maybe(name.removeprefix("commit."))
            original(name, labels)

        monkeypatch.setattr(failpoints, "hit", hit)

    def _maybe(self, step: str) -> None:
        if self.target == (self.unit, step):
            self.target = None
            self.fired.append((self.unit, step))
            raise Crash(step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.views, name)

    @contextmanager
    def unit_of_work(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        self.unit += 1
        with self.views.unit_of_work(*args, **kwargs) as w:
            yield w
            self._maybe("body")


class ProjectionHostContract:
    STEPS: tuple[str, ...] = ("body",)  # where a unit of this store can die

    @classmethod
    def make(cls, path: Path) -> ViewStore:
        raise NotImplementedError

    @pytest.mark.parametrize("batch", [7, 500])
    def test_the_notification_log_gives_the_reference(
        self, log: LogBuilder, reference: dict[str, Any], batch: int, tmp_path: Path
    ) -> None:
        views = self.make(tmp_path / "v")
        try:
            runner = EmbeddedRunner(log.app, views, PARAMS, batch=batch)
            runner.catch_up()
            assert runner.position() == runner.log_position()
            assert snapshot(views) == reference
        finally:
            views.close()

    @pytest.mark.parametrize("size", [1, 7, 1000])
    def test_takes_over_partitions_give_the_reference(
        self, log: LogBuilder, reference: dict[str, Any], size: int, tmp_path: Path
    ) -> None:
        views = self.make(tmp_path / "v")
        try:
            effects: list[Any] = []
            host = host_for(log, views, effects)
            by_partition = partitioned(log.notes())
            mixed = 0
            for take in takes(by_partition, size):
                mixed += len(take) > 1
                host.apply_take(take)
            assert mixed > 0
            assert snapshot(views) == reference
            sent = sum(1 for n in log.notes() if n.topic.endswith("MessageSent"))
            assert sum(isinstance(e, Delivered) for e in effects) == sent
        finally:
            views.close()

    def test_a_unit_dying_at_every_step_then_retried_gives_the_reference(
        self, log: LogBuilder, reference: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every unit dies at each step in turn (what it wrote before the step stays), then
        commits on the next try; the effects are those of committed units only, never twice."""
        views = self.make(tmp_path / "v")
        try:
            dies = Dies(views, monkeypatch)
            effects: list[Any] = []
            host = host_for(log, dies, effects)
            for take in takes(partitioned(log.notes()), 7):
                for step in (*self.STEPS, None):
                    dies.target = None if step is None else (dies.unit + 1, step)
                    try:
                        host.apply_take(take)
                        break
                    except Crash:
                        continue
            assert {s for _, s in dies.fired} == set(self.STEPS), dies.fired
            assert snapshot(views) == reference
            sent = sum(1 for n in log.notes() if n.topic.endswith("MessageSent"))
            pushed = [(e.tenant, e.conversation_id, e.seq) for e in effects if isinstance(e, Delivered)]
            assert len(pushed) == len(set(pushed)), "a message pushed twice"
            if self.STEPS == ("body",):  # nothing of a dead unit lands: every push is made once
                assert len(pushed) == sent
            else:  # a unit that died after its heads landed is skipped on retry: no push (ADR-0029)
                assert 0 < len(pushed) <= sent
        finally:
            views.close()


class TestMemoryViewsHost(ProjectionHostContract):
    @classmethod
    def make(cls, path: Path) -> ViewStore:
        return MemoryViews()


class TestSqliteViewsHost(ProjectionHostContract):
    @classmethod
    def make(cls, path: Path) -> ViewStore:
        return open_views(path, PARAMS.mailbox_shards)


class TestCassandraViewsHost(OnCassandra, ProjectionHostContract):
    """On the running Cassandra: one keyspace for the class, emptied for each store."""

    STEPS = ("body", "mailbox", "rows", "heads", "session_heads", "tracking")  # adapters/cassandra/views.py _commit


# -- the host on in-memory views: batches, redelivery, a failed unit, a revoked partition -----------


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_the_host_builds_the_reference_views_whatever_the_batches(log: LogBuilder, batch: int) -> None:
    views = MemoryViews()
    effects: list[Any] = []
    host = host_for(log, views, effects)
    by_partition = partitioned(log.notes())
    for p, records in by_partition.items():
        for i in range(0, len(records), batch):
            host.apply(p, records[i : i + batch])
    assert snapshot(views) == snapshot(log.views)
    sent = sum(
        1 for r in sum(by_partition.values(), []) if isinstance(r, EventRecord) and r.topic.endswith("MessageSent")
    )
    assert sum(isinstance(e, Delivered) for e in effects) == sent

    # Redelivered from the start, by a fresh host (a rebalance) and by this one: nothing changes.
    before = snapshot(views)
    for h in (host, host_for(log, views, effects)):
        n = len(effects)
        for p, records in by_partition.items():
            h.apply(p, records)
        assert snapshot(views) == before and len(effects) == n


class FailingViews(MemoryViews):
    """In-memory views whose units of work fail while `failures` > 0 (after the writes)."""

    failures = 0

    def unit_of_work(self, *args: Any, **kwargs: Any) -> Any:
        from contextlib import contextmanager

        inner = super().unit_of_work

        @contextmanager
        def unit() -> Iterator[Any]:
            with inner(*args, **kwargs) as w:
                yield w
                if self.failures > 0:
                    self.failures -= 1
                    raise OSError("disk I/O error (injected)")

        return unit()


def test_a_failed_unit_changes_nothing_and_the_retry_applies_it_once(log: LogBuilder) -> None:
    views = FailingViews()
    effects: list[Any] = []
    host = host_for(log, views, effects)
    by_partition = partitioned(log.notes())
    for p, records in by_partition.items():
        half = len(records) // 2
        host.apply(p, records[:half])
        views.failures = 2
        for _ in range(2):
            with pytest.raises(OSError):
                host.apply(p, records[half:])
        host.apply(p, records[half:])  # the same records again, as the worker retries them
    assert snapshot(views) == snapshot(log.views)
    assert host.stats.failures == 2 * PARTITIONS
    sent = sum(1 for n in log.notes() if n.topic.endswith("MessageSent"))
    assert sum(isinstance(e, Delivered) for e in effects) == sent  # effects only of committed units


def test_a_revoked_partition_is_forgotten_and_reloaded_from_the_views(log: LogBuilder) -> None:
    views = MemoryViews()
    by_partition = partitioned(log.notes())
    first, second = host_for(log, views), host_for(log, views)
    for p, records in by_partition.items():
        half = len(records) // 2
        first.apply(p, records[:half])
    assert all(len(records) > 2 for records in by_partition.values()), "a partition without events"
    first.forget([0, 1])
    assert first.partitions == [2, 3]
    # Another worker takes partitions 0 and 1 over from their first record; this one keeps 2, 3.
    for p, records in by_partition.items():
        (second if p in (0, 1) else first).apply(p, records)
    assert snapshot(views) == snapshot(log.views)
    assert second.stats.skipped > 0
