"""fanout/units.py `Staged` and `project`: eventsourcing's ProcessingEvent and
project_aggregate without the isinstance checks against runtime Protocols, for our
aggregates. They must collect and replay exactly what the library's would."""

from __future__ import annotations

import copy

import pytest
from eventsourcing.application import ProcessingEvent, project_aggregate

from domain.conversation import Conversation
from domain.params import Parameters
from fanout.units import Staged, project


def _conversations() -> tuple[Conversation, Conversation]:
    a = Conversation("acme", "c1", "one", 1.0)
    a.join(["ann", "bob"], 2.0, Parameters())
    b = Conversation("acme", "c2", "two", 1.0)
    return a, b


def test_staged_collects_what_the_librarys_processing_event_collects() -> None:
    a, b = _conversations()
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
    ours, theirs = Staged(), ProcessingEvent()
    ours.collect_events(a, None, b, tracking_note="x")
    theirs.collect_events(a2, None, b2, tracking_note="x")
    assert [(type(e), e.originator_id, e.originator_version) for e in ours.events] == [
        (type(e), e.originator_id, e.originator_version) for e in theirs.events
    ]
    assert list(ours.aggregates) == list(theirs.aggregates) == [a.id, b.id]
    assert ours.saved_kwargs == theirs.saved_kwargs == {"tracking_note": "x"}
    assert not a.collect_events() and not b.collect_events()  # taken, as the library takes them


def test_staged_takes_a_domain_event_the_librarys_way() -> None:
    a, _ = _conversations()
    events = a.collect_events()
    staged = Staged()
    staged.collect_events(events[0])
    assert staged.events == [events[0]] and not staged.aggregates


def test_project_replays_events_as_project_aggregate_does() -> None:
    a, _ = _conversations()
    events = a.collect_events()
    ours, theirs = project(None, events), project_aggregate(None, events)
    assert isinstance(ours, Conversation) and isinstance(theirs, Conversation)
    assert ours.__dict__ == theirs.__dict__
    assert project(ours, []) is ours


def test_project_refuses_what_is_not_an_event_as_the_library_does() -> None:
    with pytest.raises(AssertionError):
        project(None, [object()])
