"""Aggregate snapshots taken from the aggregate just saved (`CommandUnit._take_snapshots`):
every snapshot in the store must be the state the aggregate's recorded events give at its
version, whatever the commands and however they were grouped (refused commands that changed
staged aggregates included: their group's snapshots are read back from the store).

The application here snapshots at tiny intervals, so that nearly every round takes some, in
the middle of groups and at their ends."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from eventsourcing.application import project_aggregate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.conversation import Conversation
from domain.params import Parameters
from domain.quota import TenantQuota, TenantQuotaSlot
from domain.reads import MemberReadState
from domain.tier import Tier
from fanout.application import FanoutApplication
from fanout.clock import FakeClock
from tests.integration.test_group_commit import CONVERSATIONS, POPO, Op, T, call, ops


class OftenSnapshotted(FanoutApplication):
    snapshotting_intervals = {Conversation: 2, TenantQuota: 3, TenantQuotaSlot: 3, Tier: 2, MemberReadState: 2}


def state(aggregate: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(aggregate).items() if k != "_pending_events"}


def check_snapshots(app: FanoutApplication) -> int:
    """Every snapshot equals the replay of its aggregate's events up to its version; the count."""
    assert app.snapshots is not None
    ids: set[UUID] = {n.originator_id for n in app.recorder.select_notifications(start=0, limit=100_000)}
    seen = 0
    for oid in ids:
        for snapshot in app.snapshots.get(oid):
            replayed = project_aggregate(None, app.events.get(oid, lte=snapshot.originator_version))
            assert replayed is not None and replayed.version == snapshot.originator_version
            assert state(snapshot.mutate(None)) == state(replayed), (
                type(replayed).__name__,
                snapshot.originator_version,
            )
            seen += 1
    return seen


def run(rounds: list[list[Op]]) -> tuple[FanoutApplication, int]:
    clock = FakeClock()
    app = OftenSnapshotted(Parameters(), dict(POPO), clock=clock, activity_flush_interval=3600.0)
    for cid, members in CONVERSATIONS.items():
        app.create_conversation(T, cid, cid, members)
    for ops_ in rounds:
        app.grouped([call(app, op) for op in ops_])
        clock.advance(1.0)
    return app, check_snapshots(app)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(ops, min_size=1, max_size=12), min_size=1, max_size=5))
def test_every_snapshot_is_the_replay_of_its_events(rounds: list[list[Op]]) -> None:
    app, _ = run(rounds)
    app.close()


@pytest.mark.parametrize("before", [0, 1])
def test_a_group_a_refused_command_changed_takes_its_snapshots_from_the_store(before: int) -> None:
    """m3's read leaves an activity refresh pending on c0; m0's second send records it on the
    staged c0 (a new version of c0, in memory only), then is refused: the staged send is
    written first, and a snapshot due then must not be taken of that c0 (nothing recorded
    the refresh). `before` sends first shift c0's versions, so that one of the two runs has
    a snapshot due on the staged send."""
    warm = [("send", "c0", "m2", "")] * before
    app, seen = run([[*warm, ("send", "c0", "m0", ""), ("read", "c0", "m3", "0"), ("send", "c0", "m0", "")]])
    try:
        assert seen > 0
    finally:
        app.close()
