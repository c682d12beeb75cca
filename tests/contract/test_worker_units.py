"""The worker's units of work under a crash that lands everything but the heads and the
tracking (Cassandra's write order: ADR-0014), then a retry of the same records, as
`streams.host.ProjectionHost` does after a failed unit.

Units hold up to BATCH records; an event that reshapes member states (join, leave, policy
switch, REBUILD, create) is the only event of its conversation in a unit
(`streams.host.ALONE`); other conversations' events may share it. With that rule every
crash point gives the views of a clean run, also with two conversations interleaved; without
it, a send replayed with the states a later join left behind reaches the joiner (the second
test shows the rule is what makes the difference)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from eventsourcing.utils import get_topic

import streams.host as host_module
from adapters.memory import MemoryViews
from fanout.queries import Queries
from streams.host import ProjectionHost
from streams.records import EventRecord
from tests.contract.test_projection_replay import LOG_EVENTS, PARAMS, T, build_log, snapshot
from tests.integration.conftest import FakeClock, Harness

BATCH = 3  # records per batch handed to the host (a unit never holds more)


class _Crashed(ConnectionError):
    pass


class _LosesHeadsAndTracking:
    def __init__(self, writer: Any) -> None:
        self._w = writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def put_head(self, *args: Any, **kwargs: Any) -> None:
        pass

    def track(self, *args: Any) -> None:
        pass


class CrashingViews:
    """MemoryViews whose `crash_at`-th unit of work commits without its heads and tracking
    and then fails, as a worker killed between Cassandra writes would."""

    atomic_units = False  # like Cassandra's commit in rounds: the host keeps the ALONE rule

    def __init__(self, crash_at: int) -> None:
        self.views = MemoryViews()
        self.crash_at = crash_at
        self.units = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.views, name)

    @contextmanager
    def unit_of_work(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        self.units += 1
        crash = self.units == self.crash_at
        with self.views.unit_of_work(*args, **kwargs) as w:
            yield _LosesHeadsAndTracking(w) if crash else w
        if crash:
            raise _Crashed("killed after the states, before the heads")


def records(log: list[tuple[int, Any]]) -> tuple[list[EventRecord], dict[int, Any]]:
    recs = [EventRecord(pos, get_topic(type(e)), e.originator_id, e.originator_version, b"") for pos, e in log]
    return recs, dict(log)


def run(views: Any, log: list[tuple[int, Any]], size: int = BATCH) -> None:
    recs, by_position = records(log)
    host = ProjectionHost(views, PARAMS, lambda r: by_position[r.position])
    for i in range(0, len(recs), size):
        batch = recs[i : i + size]
        try:
            host.apply(0, batch)
        except _Crashed:
            host.apply(0, batch)  # the worker retries the same records after a failed unit


def outcomes(log: list[tuple[int, Any]], snap: Any = snapshot, size: int = BATCH) -> tuple[dict[str, Any], list[int]]:
    clean = MemoryViews()
    run(clean, log, size)
    reference = snap(clean)
    wrong = []
    for crash_at in range(1, len(log) + 1):
        views = CrashingViews(crash_at)
        run(views, log, size)
        if views.units >= crash_at and snap(views.views) != reference:
            wrong.append(crash_at)
    return reference, wrong


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, Any]]:
    return build_log(tmp_path_factory.mktemp("log"))


def test_every_crash_point_gives_the_views_of_a_clean_run(log: list[tuple[int, Any]]) -> None:
    assert len(log) == LOG_EVENTS
    _, wrong = outcomes(log)
    assert wrong == []


def test_without_units_of_their_own_for_membership_events_a_crash_changes_the_views(
    log: list[tuple[int, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "ALONE", frozenset())
    _, wrong = outcomes(log)
    assert wrong, "the rule made no difference: this test no longer shows why it exists"


# -- two conversations interleaved: a reshaping event shares its unit with the other's events ------

TWO = ("g", "h")
TWO_USERS = ("a", "b", "c", "x", "y")


def build_two_log(data_dir: Any) -> list[tuple[int, Any]]:
    """Sends to g interleaved with joins, a leave and sends of h, so that most units of
    BATCH records mix a reshaping event of one conversation with the other's sends."""
    clock = FakeClock()
    h = Harness(data_dir, PARAMS, clock)
    try:
        app = h.app
        app.create_conversation(T, "g", "g", ["a", "b", "c"])
        app.create_conversation(T, "h", "h", ["a", "b"])
        h.settle()

        def send(cid: str, sender: str, **kw: Any) -> None:
            clock.advance(3.0)
            app.send_message(T, cid, sender=sender, text=f"{cid} from {sender}", **kw)
            h.settle()

        send("g", "a", mentions=["b"])
        app.add_members(T, "h", ["x"])
        send("g", "b")
        send("h", "x", mentions=["a"])
        app.add_members(T, "h", ["y"])
        send("g", "c", mention_all=True)
        send("h", "a")
        app.remove_member(T, "h", "b")
        send("g", "a")
        send("h", "y", mentions=["x"])
        app.add_members(T, "g", ["y"])
        send("h", "x")
        send("g", "y")
        h.settle()
        notes = app.recorder.select_notifications(start=0, limit=10_000)
        return [(n.id, app.mapper.to_domain_event(n)) for n in notes]
    finally:
        h.close()


def snapshot_two(views: Any) -> dict[str, Any]:
    q = Queries(views, PARAMS)
    out: dict[str, Any] = {cid: views.head(T, cid) for cid in TWO}
    for cid in TWO:
        latest = out[cid]["latest_conversation_seq"]
        out[f"delivery/{cid}"] = [
            {k: v for k, v in q.delivery(T, cid, s).items() if k != "materialized_at"} for s in range(1, latest + 1)
        ]
    for u in TWO_USERS:
        out[f"sessions/{u}"] = q.session_list(T, u)
        out[f"mailbox/{u}"] = q.mailbox(T, u, 0, 1000)["entries"]
    return out


@pytest.fixture(scope="module")
def two_log(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, Any]]:
    return build_two_log(tmp_path_factory.mktemp("two"))


@pytest.mark.parametrize("size", [3, 4, 6])
def test_two_conversations_interleaved_every_crash_point_gives_the_views_of_a_clean_run(
    two_log: list[tuple[int, Any]], size: int
) -> None:
    _, wrong = outcomes(two_log, snapshot_two, size)
    assert wrong == []


def test_two_conversations_interleaved_without_the_rule_a_crash_changes_the_views(
    two_log: list[tuple[int, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "ALONE", frozenset())
    wrong = [size for size in (3, 4, 6) if outcomes(two_log, snapshot_two, size)[1]]
    assert wrong, "the rule made no difference on this log: it no longer shows why it exists"


def test_a_reshaping_event_shares_its_unit_with_the_other_conversations_events(
    two_log: list[tuple[int, Any]],
) -> None:
    """Fewer units than a unit of its own per reshaping event would give: the rule is per
    conversation, not per unit."""
    views = CrashingViews(0)
    run(views, two_log)
    reshaping = sum(1 for _, e in two_log if get_topic(type(e)) in host_module.ALONE)
    recs, _ = records(two_log)
    whole_batches = -(-len(recs) // BATCH)
    # a unit of its own for each reshaping event would cut a batch around it: more units than this
    assert views.units < whole_batches + reshaping, (views.units, whole_batches, reshaping)
