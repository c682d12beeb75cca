"""Idempotence of the projections under at-least-once delivery, written once and run
against every view-store backend: a unit of work whose view writes committed but whose
tracking position did not (a crash between the two, or a Kafka redelivery) is replayed
by a fresh projection from the tracked position, and the views end up exactly as if
every event had been applied once.

The log is real: commands on the embedded runtime's SQLite event store, mapped back
to domain events. Split points cover every event of the log."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest

from adapters.memory import MemoryViews
from domain.params import Parameters
from fanout.bootstrap import open_views
from fanout.queries import Queries
from projections.capacity import CapacityProjection
from projections.delivery import DeliveryProjection
from projections.hosting import build_projections
from projections.ports import ViewStore
from tests.contract.test_view_store import OnCassandra
from tests.integration.conftest import FakeClock, Harness

T = "acme"
USERS = ("a", "b", "c", "x")
PARAMS = Parameters(mailbox_shards=4)
LOG_EVENTS = 29  # build_log's events; the test of every split point checks it
PARTIAL_UNIT = 1  # events in the unit of work whose heads and tracking are lost


def build_log(data_dir: Path) -> list[tuple[int, Any]]:
    """A log with every kind of event the delivery projection folds by appending: personal
    mentions and replies (mention_count), @all and announcements (broadcasts), plus
    joins, a leave, MARK_READ (members' read streams and the activity they record on the
    conversation, ADR-0018) and REBUILD."""
    clock = FakeClock()
    h = Harness(data_dir, PARAMS, clock)
    try:
        app = h.app
        app.create_conversation(T, "g", "g", ["a", "b", "c"])

        def send(sender: str, **kw: Any) -> None:
            clock.advance(3.0)
            app.send_message(T, "g", sender=sender, text=f"from {sender}", **kw)
            h.settle()  # replies are resolved on the query side

        h.settle()
        send("a", mentions=["b"])
        send("b", mention_all=True)
        send("c", reply_to_seq=1)
        send("a", announcement=True)
        app.add_members(T, "g", ["x"])
        send("c", mentions=["b", "x"])
        app.mark_read(T, "g", "b", 4)  # b's first read: MemberReadState.Created
        app.mark_read(T, "g", "x", 5)  # x was never active: a MembersActive precedes the next send
        send("a", mentions=["b"], mention_all=True)
        app.request_rebuild(T, "g", "b")
        app.mark_read(T, "g", "x", 6)  # MemberReadState.ReadMarked (x is active: nothing more)
        app.remove_member(T, "g", "c")
        send("x", mentions=["a"])
        rid = app.open_review(T, "small", "manual", {}, "admin")["review_id"]
        app.decide_review(T, rid, "enable_mention_only", "admin", 1000.0, 0.5)
        app.roll_back_tier(T, "small", "admin", "test")
        h.settle()
        notes = app.recorder.select_notifications(start=0, limit=10_000)
        return [(n.id, app.mapper.to_domain_event(n)) for n in notes]
    finally:
        h.close()


class _NoTracking:
    """A writer whose view writes commit but whose tracking position is lost."""

    def __init__(self, writer: Any) -> None:
        self._w = writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def track(self, projection: str, position: int, partition: int = 0) -> None:
        # The tracking row is lost, but the unit still knows the position it applies: a
        # store stamps the unit's rows with it (Cassandra: adapters/cassandra/stamps.py).
        self._w.track_log(partition, position, -1)


class _NoHeadNoTracking(_NoTracking):
    """A writer of a unit that crashed after everything but the heads and the tracking
    landed: the order a store without cross-partition transactions (Cassandra) writes
    in (mailbox, messages, delivery records, states, admin views, then heads, then
    tracking)."""

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, Any], *, lookups: bool = True) -> None:
        pass


class Crash(Exception):
    """The process died at a step of its commit (what the rounds before it wrote stays)."""


def apply(
    views: Any,
    events: list[tuple[int, Any]],
    *,
    tracking: bool = True,
    heads: bool = True,
    crash_at: str | None = None,
) -> None:
    """Apply events in one unit of work with every declared projection, freshly built
    (as a restarted runner or a newly assigned Faust partition would be). `crash_at`: the
    commit stops at that step (the store's checkpoint raises Crash)."""
    projections = build_projections(views, PARAMS)
    with views.unit_of_work(checkpoint=None if crash_at is None else partial(_crash_at, crash_at)) as w:
        writer = w if tracking else _NoTracking(w) if heads else _NoHeadNoTracking(w)
        for position, event in events:
            for p in projections:
                if type(event) in p.topics:
                    p.process(event, position, writer)
        for p in projections:
            p.flush(writer)
            if events:
                writer.track(p.name, events[-1][0])


def _crash_at(step: str, reached: str) -> None:
    if reached == step:
        raise Crash(step)


def snapshot(views: Any) -> dict[str, Any]:
    q = Queries(views, PARAMS)
    out: dict[str, Any] = {
        "head": views.head(T, "g"),
        "capacity": views.capacity_state(CapacityProjection.name),
        "reviews": views.reviews(T),
    }
    for u in USERS:
        sessions, big = q.session_list(T, u)
        out[f"sessions/{u}"] = sessions
        out[f"mailbox/{u}"] = q.mailbox(T, u, 0, 1000)["entries"]
    latest = out["head"]["latest_conversation_seq"]
    out["delivery"] = [
        {k: v for k, v in q.delivery(T, "g", s).items() if k != "materialized_at"} for s in range(1, latest + 1)
    ]
    return out


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, Any]]:
    return build_log(tmp_path_factory.mktemp("log"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The split points of the contract's two replay tests: SPLITS of the class (the crash
    between the rounds of a commit names its own: every event)."""
    marked = any(m.name == "parametrize" for m in metafunc.definition.iter_markers())
    if "split" in metafunc.fixturenames and not marked and hasattr(metafunc.cls, "SPLITS"):
        metafunc.parametrize("split", metafunc.cls.SPLITS)


class ProjectionReplayContract:
    SPLITS: ClassVar[Sequence[int]] = range(LOG_EVENTS)  # the split points: every event of the log

    @classmethod
    def make(cls, path: Path) -> ViewStore:
        raise NotImplementedError

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, log: list[tuple[int, Any]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
        views = cls.make(tmp_path_factory.mktemp("reference"))
        try:
            apply(views, log)
            return snapshot(views)
        finally:
            views.close()

    def test_the_log_exercises_mentions_and_broadcasts(self, reference: dict[str, Any]) -> None:
        b = next(s for s in reference["sessions/b"] if s["conversation_id"] == "g")
        assert b["mention_count"] >= 2 and reference["head"]["broadcasts"] == 3

    def test_replaying_the_suffix_after_a_partial_commit_changes_nothing(
        self, split: int, log: list[tuple[int, Any]], reference: dict[str, Any], tmp_path: Path
    ) -> None:
        assert len(log) == LOG_EVENTS, f"the log has {len(log)} events: set LOG_EVENTS to it"
        views = self.make(tmp_path / "v")
        try:
            apply(views, log[:split])
            apply(views, log[split:], tracking=False)  # views written, tracking lost
            assert views.position(DeliveryProjection.name) == (log[split - 1][0] if split else 0)
            apply(views, log[split:])  # at-least-once: the suffix again, from the tracked position
            assert snapshot(views) == reference
        finally:
            views.close()

    def test_replaying_after_a_commit_that_lost_its_heads_and_tracking_changes_nothing(
        self, split: int, log: list[tuple[int, Any]], reference: dict[str, Any], tmp_path: Path
    ) -> None:
        """A partial commit: the next event's writes landed except its head (with the
        position the projections skip by) and the tracking, so the replay reloads member
        states and broadcasts that already hold that event."""
        views = self.make(tmp_path / "v")
        try:
            apply(views, log[:split])
            apply(views, log[split : split + PARTIAL_UNIT], tracking=False, heads=False)
            assert views.position(DeliveryProjection.name) == (log[split - 1][0] if split else 0)
            apply(views, log[split:])  # the suffix again, from the tracked position
            assert snapshot(views) == reference
        finally:
            views.close()


class CommitInRoundsContract:
    """A store whose commit is several rounds of requests (no transaction across them):
    the unit dies at each step between its rounds, at every split point of the log, and
    replaying the suffix from the tracked position yields the reference views."""

    COMMIT_STEPS: tuple[str, ...] = ()  # the steps the store's commit passes (its checkpoint names)

    @classmethod
    def make(cls, path: Path) -> ViewStore:
        raise NotImplementedError

    @pytest.mark.parametrize("split", range(LOG_EVENTS))
    def test_replaying_after_a_crash_between_the_rounds_of_a_commit_changes_nothing(
        self, split: int, log: list[tuple[int, Any]], reference: dict[str, Any], tmp_path: Path
    ) -> None:
        assert self.COMMIT_STEPS, "a store in this contract names the steps of its commit"
        views = self.make(tmp_path / "v")
        try:
            apply(views, log[:split])
            for step in self.COMMIT_STEPS:
                with pytest.raises(Crash):  # the store reached the step: what came before it landed
                    apply(views, log[split : split + 2], crash_at=step)
                assert views.position(DeliveryProjection.name) == (log[split - 1][0] if split else 0)
            apply(views, log[split:])  # the suffix again, from the tracked position
            assert snapshot(views) == reference
        finally:
            views.close()


class TestSqliteViewsReplay(ProjectionReplayContract):
    @classmethod
    def make(cls, path: Path) -> ViewStore:
        return open_views(path, PARAMS.mailbox_shards)


class TestMemoryViewsReplay(ProjectionReplayContract):
    @classmethod
    def make(cls, path: Path) -> ViewStore:
        return MemoryViews()


class TestCassandraViewsReplay(OnCassandra, ProjectionReplayContract, CommitInRoundsContract):
    """On the running Cassandra: one keyspace for the class, emptied for each store
    (the reference is built, and snapshotted, before any split point's store)."""

    COMMIT_STEPS = ("mailbox", "rows", "heads", "session_heads", "tracking")  # adapters/cassandra/views.py _commit
    # The crash between the rounds, at every split point, dies at `heads` (rows written, head
    # and tracking lost) and at `tracking` (all but the tracking written): the two replay tests'
    # cases, on a unit of two events. Those two run here at every third split point; every
    # split point on the other stores. (A Cassandra case costs 2-4 s: 58 of them were 3 minutes.)
    SPLITS = range(0, LOG_EVENTS, 3)

    @classmethod
    def make(cls, path: Path) -> ViewStore:
        """A login reads every head from the session heads' copy (ADR-0042; by default only
        from 500 heads on): a copy left behind its head by a crash shows in the session lists."""
        views = super().make(path)
        views.copy_read_from = 1  # type: ignore[attr-defined]
        return views
