"""The unit of work of one command and the group of them written in one transaction.

A command (fanout/command_unit.py `CommandUnit._unit`) collects the aggregates it changes in a
`Unit` and saves them atomically. `CommandUnit.grouped` runs queued commands on one thread as a
`Group`: each decided on its own, their events staged and written in ONE event-store
transaction (ADR-0030); `outcome` is how each command's result or refusal is handed back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID

from eventsourcing.application import ProcessingEvent
from eventsourcing.domain import Aggregate, CanMutateProtocol


class Staged(ProcessingEvent[UUID]):
    """eventsourcing's ProcessingEvent without its isinstance checks against runtime Protocols
    for our own aggregates: on Python 3.11 each such check walks the Protocol's attributes
    (11-36 us, four a send: ~10% of a send's CPU on the command thread, profiled 2026-12-05).
    Anything that is not an `Aggregate` goes the library's way.

    `tainted`: a refused command changed aggregates staged here after they were collected,
    so their objects may hold what was never recorded; snapshots are then read back from the
    store (`CommandUnit._take_snapshots`)."""

    tainted = False

    def collect_events(self, *objs: Any, **kwargs: Any) -> None:
        for obj in objs:
            if isinstance(obj, Aggregate):  # a concrete class: a plain isinstance
                self.events.extend(obj.collect_events())
                self.aggregates[obj.id] = obj
            elif obj is not None:
                super().collect_events(obj)
        self.saved_kwargs.update(kwargs)


def project(aggregate: Any, events: Iterable[Any]) -> Any:
    """eventsourcing's project_aggregate (each event mutates the aggregate in turn) without
    its assert isinstance against CanMutateProtocol per event (36 us each on Python 3.11)."""
    for event in events:
        mutate = getattr(event, "mutate", None)
        if mutate is None:  # not our kind of event: the library's check says what is wrong
            assert isinstance(event, CanMutateProtocol)
        aggregate = event.mutate(aggregate)
    return aggregate


class Unit(list[Aggregate]):
    """The aggregates one command saves atomically; after the save, `position` is the
    notification id of the last event it recorded (None when it recorded nothing)."""

    position: int | None = None

    def __init__(self) -> None:
        super().__init__()
        # (conversation key, pending activity applied): cleared from the pending map once saved
        self.activity: list[tuple[tuple[str, str], dict[str, float], bool]] = []
        # aggregates taken from the cache without a fast-forward (shared store only)
        self.unchecked: list[Aggregate] = []

    def touch(self, aggregate: Aggregate) -> None:
        """Add an aggregate to save, once (by identity)."""
        if not any(a is aggregate for a in self):
            self.append(aggregate)


class Group:
    """Commands run together by `CommandUnit.grouped` on one thread: each decided on its
    own, their events staged in one ProcessingEvent and written in ONE event-store transaction
    (ADR-0030)."""

    def __init__(self) -> None:
        self.owner = threading.get_ident()
        self.processing: Staged = Staged()
        self.units: list[tuple[Unit, int, int]] = []  # a unit and its slice of processing.events
        self.answers: list[tuple[dict[str, Any], Unit]] = []  # results whose position awaits the commit
        self.evicted: set[UUID] = set()  # aggregates a refused command of the group dropped from the cache

    def stage(self, unit: Unit) -> None:
        first = len(self.processing.events)
        if unit:
            self.processing.collect_events(*unit)
        self.units.append((unit, first, len(self.processing.events)))

    def reset(self) -> None:
        """After the staged commands were written: the next ones start a new transaction."""
        self.processing = Staged()
        self.units, self.answers, self.evicted = [], [], set()


class GroupBroken(Exception):  # noqa: N818 (control flow of `grouped`, never raised out of it)
    """Writing a group's staged commands failed while a later command of the group needed
    them written: nothing of them is written, and the group runs again alone from them."""


Outcome = tuple[Any, BaseException | None]


def outcome(call: Callable[[], Any]) -> Outcome:
    """(result, None) or (None, what it raised): a call's outcome, as an executor hands it over."""
    try:
        return call(), None
    except BaseException as exc:  # handed to its caller, as an executor would
        return None, exc
