"""The projection host's fencing and healing (streams/host.py ProjectionHost, ADR-0021),
engine-free: the in-memory views, a log of real events (popo event store), records with
Kafka-like offsets and a log reader over the same records.

* The views lose the last units this host committed (what a Cassandra crash with a periodic
  commit log does): the host notices before its next batch, reloads, reads the lost range
  again from the offset kept with the tracking, and ends with the reference views.
* A partition resumed past where the views stand (Kafka's committed offsets ahead of the
  views) is filled from the log first.
* Another writer has written the partition past this host: Fenced, one line, reloaded.
* A unit that runs past FENCE_RECHECK while another writer moves the partition is stopped
  between its commit steps, before its tracking.
* The fence read of a take is in flight while its unit folds and answered before the unit
  writes; a takeover landing during the fold is fenced with nothing written (ADR-0047)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from adapters.memory import MemoryViews
from streams import host as host_module
from streams.host import Fenced, Record
from streams.records import EventRecord, Watermark
from tests.host_log import LogBuilder, host_for, partitioned, popo_log, snapshot  # noqa: F401

Offsets = dict[int, list[Record]]


def with_offsets(by_partition: dict[int, list[Record]]) -> Offsets:
    """Each partition's records at offsets 0, 2, 4, ... (a transaction marker between two)."""
    return {p: [dataclasses.replace(r, offset=2 * i) for i, r in enumerate(rs)] for p, rs in by_partition.items()}


class ListReader:
    """A LogReader over the records of each partition (what Kafka holds)."""

    def __init__(self, log: Offsets) -> None:
        self.log = log
        self.reads: list[tuple[int, int, int]] = []

    def read(self, partition: int, start: int, end: int) -> list[EventRecord | Watermark]:
        self.reads.append((partition, start, end))
        return [r for r in self.log[partition] if start <= r.offset < end]


def host(b: LogBuilder, views: Any, log: Offsets) -> Any:
    h = host_for(b, views)
    h.log_reader = ListReader(log)
    return h


def apply_all(h: Any, log: Offsets, batch: int) -> None:
    for p, records in log.items():
        for i in range(0, len(records), batch):
            h.apply(p, records[i : i + batch])


def test_views_that_lost_the_last_units_are_healed_from_the_log(popo_log: LogBuilder) -> None:  # noqa: F811
    log = with_offsets(partitioned(popo_log.notes()))
    lost_views = MemoryViews()  # what is left after the crash: the first half of each partition
    first = host(popo_log, lost_views, log)
    halves = {p: len(rs) // 2 for p, rs in log.items()}
    assert all(len(rs) > halves[p] + 4 for p, rs in log.items()), {p: len(rs) for p, rs in log.items()}
    for p, rs in log.items():
        first.apply(p, rs[: halves[p]])
    views = MemoryViews()
    h = host(popo_log, views, log)
    for p, rs in log.items():
        h.apply(p, rs[: halves[p] + 3])  # three more records committed, then lost
    h.views = lost_views  # the views came back without them
    for p, rs in log.items():
        h.apply(p, rs[halves[p] + 3 :])  # the records after: the three lost ones must come back
    assert snapshot(lost_views) == snapshot(popo_log.views)
    assert h.stats.heals == len(log)
    # read again from the offset after the last record the views kept (offsets are even here)
    assert {(p, start) for p, start, _ in h.log_reader.reads} == {(p, 2 * halves[p] - 1) for p in log}


def test_views_that_lost_every_unit_of_a_partition_are_healed_from_its_start(popo_log: LogBuilder) -> None:  # noqa: F811
    """The crash took everything the host had committed (no unit synced to disk since the
    partition's first): the views hold no log position at all for it, which is as far below
    what the host committed as views can be; the whole partition is read again."""
    log = with_offsets(partitioned(popo_log.notes()))
    views = MemoryViews()
    h = host(popo_log, views, log)
    for p, rs in log.items():
        h.apply(p, rs[:5])
    h.views = MemoryViews()  # the views came back empty
    for p, rs in log.items():
        h.apply(p, rs[5:])
    assert snapshot(h.views) == snapshot(popo_log.views)
    assert h.stats.heals == len(log)
    assert {(p, start) for p, start, _ in h.log_reader.reads} == {(p, 0) for p in log}


def test_a_heal_cut_short_by_a_failure_heals_again_on_the_retry(popo_log: LogBuilder) -> None:  # noqa: F811
    """Right after Cassandra restarts, a request may meet a dead connection: the take finds
    the first partition's views below what it committed and reads the lost records again,
    then the next partition's read fails and the take is retried. The records read again
    lived in the failed take only: the retry must find the hole again (before, the first
    partition stood loaded at the views' position and went on without them)."""
    log = with_offsets(partitioned(popo_log.notes()))
    first, second = sorted(log)[:2]
    lost_views = MemoryViews()
    host(popo_log, lost_views, log).apply_take({p: rs[: len(rs) // 2] for p, rs in log.items()})
    h = host(popo_log, MemoryViews(), log)
    h.apply_take({p: rs[: len(rs) // 2 + 3] for p, rs in log.items()})  # three more, then lost
    real, failed = lost_views.log_position, []

    def dead_connection_once(partition: int) -> Any:
        if partition == second and not failed:
            failed.append(partition)
            raise ConnectionError("a request on a connection the restart killed")
        return real(partition)

    lost_views.log_position = dead_connection_once  # type: ignore[method-assign]
    h.views = lost_views
    rest = {p: rs[len(rs) // 2 + 3 :] for p, rs in log.items()}
    with pytest.raises(ConnectionError):
        h.apply_take(rest)
    assert failed == [second] and h.stats.heals == 1  # the first partition had been healed
    h.apply_take(rest)  # the retry, with the same records
    assert snapshot(lost_views) == snapshot(popo_log.views)
    reads = {p for p, _, _ in h.log_reader.reads}
    assert first in reads and second in reads


def test_a_partition_resumed_past_the_views_is_filled_from_the_log_first(popo_log: LogBuilder) -> None:  # noqa: F811
    log = with_offsets(partitioned(popo_log.notes()))
    views = MemoryViews()
    h = host(popo_log, views, log)
    for p, rs in log.items():
        h.apply(p, rs[:3])
    h.forget()  # a restart: Kafka's committed offsets say 6 records were done, the views hold 3
    for p, rs in log.items():
        h.apply(p, rs[6:])
    assert snapshot(views) == snapshot(popo_log.views)
    assert h.stats.reread == 3 * len(log) and h.stats.heals == 0


def test_a_host_whose_partition_was_written_past_it_is_fenced_and_reloads(popo_log: LogBuilder) -> None:  # noqa: F811
    log = with_offsets(partitioned(popo_log.notes()))
    views = MemoryViews()
    stale, owner = host(popo_log, views, log), host(popo_log, views, log)
    for p, rs in log.items():
        stale.apply(p, rs[:4])
    for p, rs in log.items():
        owner.apply(p, rs[:8])  # took the partitions over and moved on
    for p, rs in log.items():
        with pytest.raises(Fenced, match="another worker"):
            stale.apply(p, rs[4:6])  # wakes up with the records it had fetched
        stale.apply(p, rs[4:6])  # the retry reloads: everything at or below the owner's is skipped
    assert stale.stats.fenced == len(log)
    for p, rs in log.items():
        owner.apply(p, rs[8:])
    assert snapshot(views) == snapshot(popo_log.views)


class HookedViews(MemoryViews):
    """In-memory views that call `committing(w, checkpoint)` when a unit's block exits
    cleanly, before the store writes it."""

    def committing(self, w: Any, checkpoint: Any) -> None:
        pass

    def unit_of_work(self, *args: Any, **kwargs: Any) -> Any:
        from contextlib import contextmanager

        inner = super().unit_of_work

        @contextmanager
        def unit() -> Any:
            with inner(*args, **kwargs) as w:
                yield w
                self.committing(w, kwargs.get("checkpoint"))

        return unit()


class SteppedViews(HookedViews):
    """In-memory views whose commit calls the writer's checkpoint between two steps, and
    runs `between` (another writer's commit) there once, as Cassandra's commit would."""

    between: Any = None

    def committing(self, w: Any, checkpoint: Any) -> None:
        if checkpoint is not None and w.positions:
            checkpoint("heads")
            if self.between is not None:
                run, self.between = self.between, None
                run()
            checkpoint("tracking")


def test_a_unit_paused_mid_commit_is_stopped_before_its_tracking(
    popo_log: LogBuilder,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_module, "FENCE_RECHECK", 0.0)  # every step checks (a long pause)
    log = with_offsets(partitioned(popo_log.notes()))
    views = SteppedViews()
    stale, owner = host(popo_log, views, log), host(popo_log, views, log)
    p, rs = next((p, rs) for p, rs in log.items() if len(rs) > 8)
    stale.apply(p, rs[:3])
    views.between = lambda: owner.apply(p, rs[:8])  # the takeover lands while the stale unit commits
    with pytest.raises(Fenced, match="unit is stopped"):
        stale.apply(p, rs[3:5])
    assert views.log_position(p).position == max(r.position for r in rs[:8])
    owner.apply(p, rs[8:])
    for q, others in log.items():
        if q != p:
            owner.apply(q, others)
    assert snapshot(views) == snapshot(popo_log.views)


class ReadAheadViews(HookedViews):
    """In-memory views that record when a fence read starts and is answered, and when a
    unit's writes begin (ADR-0047)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []

    def log_position_later(self, partition: int) -> Any:
        self.steps.append("read started")
        answer = super().log_position_later(partition)

        def answered() -> Any:
            self.steps.append("read answered")
            return answer()

        return answered

    def committing(self, w: Any, checkpoint: Any) -> None:
        self.steps.append("writes")  # the block exited cleanly: the store writes now


def test_the_fence_read_is_in_flight_while_the_unit_folds_and_answered_before_it_writes(
    popo_log: LogBuilder,  # noqa: F811
) -> None:
    log = with_offsets(partitioned(popo_log.notes()))
    views = ReadAheadViews()
    h = host(popo_log, views, log)
    folding = h.to_domain_event

    def fold(r: Any) -> Any:
        views.steps.append("fold")
        return folding(r)

    h.to_domain_event = fold
    p, rs = next((p, rs) for p, rs in log.items() if len(rs) > 8)
    h.apply(p, rs[:3])  # the first take loads the partition: nothing of this host to check
    assert "read started" not in views.steps
    views.steps.clear()
    h.apply(p, rs[3:8])
    steps = [s for i, s in enumerate(views.steps) if s != "fold" or views.steps[i - 1] != "fold"]
    assert steps == ["read started", "fold", "read answered", "writes"], views.steps


def test_a_partition_taken_over_while_the_unit_folds_is_fenced_before_it_writes(
    popo_log: LogBuilder,  # noqa: F811
) -> None:
    log = with_offsets(partitioned(popo_log.notes()))
    views = MemoryViews()
    stale, owner = host(popo_log, views, log), host(popo_log, views, log)
    p, rs = next((p, rs) for p, rs in log.items() if len(rs) > 8)
    stale.apply(p, rs[:3])
    folding, takeover = stale.to_domain_event, [lambda: owner.apply(p, rs[:8])]

    def fold(r: Any) -> Any:
        if takeover:
            takeover.pop()()  # the takeover lands after the fence read started, during the fold
        return folding(r)

    stale.to_domain_event = fold
    with pytest.raises(Fenced, match="another worker"):
        stale.apply(p, rs[3:5])
    assert views.log_position(p).position == max(r.position for r in rs[:8])  # nothing of the stale unit
    stale.apply(p, rs[3:5])  # the retry reloads: everything at or below the owner's is skipped
    owner.apply(p, rs[8:])
    for q, others in log.items():
        if q != p:
            owner.apply(q, others)
    assert snapshot(views) == snapshot(popo_log.views)
