"""The worker's units of work under a crash that lands everything but the heads and the
tracking (Cassandra's write order: ADR-0014), then a retry of the same records, as
`streams.worker.PartitionHost` does after a failed unit.

Units hold up to BATCH records; events that reshape member states (join, leave, policy
switch, REBUILD, create) get a unit of their own (`streams.worker.ALONE`). With that
rule every crash point gives the views of a clean run; without it, a send replayed with
the states a later join left behind reaches the joiner (the second test shows the rule is
what makes the difference)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from eventsourcing.utils import get_topic

import streams.worker as worker
from adapters.memory import MemoryViews
from streams.records import EventRecord
from streams.worker import PartitionHost
from tests.contract.test_projection_replay import LOG_EVENTS, PARAMS, build_log, snapshot

BATCH = 3  # records per batch handed to the host (a unit never holds more)


class _Crashed(ConnectionError):
    pass


class _LosesHeadsAndTracking:
    def __init__(self, writer: Any) -> None:
        self._w = writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def put_head(self, *args: Any) -> None:
        pass

    def track(self, *args: Any) -> None:
        pass


class CrashingViews:
    """MemoryViews whose `crash_at`-th unit of work commits without its heads and tracking
    and then fails, as a worker killed between Cassandra writes would."""

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
    recs = [
        EventRecord(pos, get_topic(type(e)), e.originator_id, e.originator_version, b"") for pos, e in log
    ]
    return recs, dict(log)


def run(views: Any, log: list[tuple[int, Any]]) -> None:
    recs, by_position = records(log)
    host = PartitionHost(views, PARAMS, lambda r: by_position[r.position])
    for i in range(0, len(recs), BATCH):
        batch = recs[i : i + BATCH]
        try:
            host.apply(0, batch)
        except _Crashed:
            host.apply(0, batch)  # the worker retries the same records after a failed unit


def outcomes(log: list[tuple[int, Any]]) -> tuple[dict[str, Any], list[int]]:
    clean = MemoryViews()
    run(clean, log)
    reference = snapshot(clean)
    wrong = []
    for crash_at in range(1, LOG_EVENTS + 1):
        views = CrashingViews(crash_at)
        run(views, log)
        if views.units >= crash_at and snapshot(views.views) != reference:
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
    monkeypatch.setattr(worker, "ALONE", frozenset())
    _, wrong = outcomes(log)
    assert wrong, "the rule made no difference: this test no longer shows why it exists"
