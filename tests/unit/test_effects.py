"""fanout/effects.py: what each process does after a unit of work committed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fanout.effects import Effects, open_review, push_online
from projections.capacity import ReviewTrigger
from projections.delivery import Delivered
from projections.hosting import ViewsTracked


def delivered(seq: int) -> Delivered:
    return Delivered("acme", "g", seq, {"seq": seq}, None, {0: ["u1", "u2"]}, 1)


class Hub:
    def __init__(self, pushes: int, fail_on: int | None = None) -> None:
        self.pushes, self.fail_on, self.seen = pushes, fail_on, []

    def deliver(self, effect: Delivered) -> int:
        if effect.seq == self.fail_on:
            raise OSError("socket gone")
        self.seen.append(effect.seq)
        return self.pushes


class Counts:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, int, int]] = []

    def record_pushes(self, tenant: str, conversation_id: str, seq: int, pushes: int) -> None:
        self.recorded.append((tenant, conversation_id, seq, pushes))


def test_each_effect_goes_to_the_handlers_of_its_type_in_order() -> None:
    seen: list[tuple[str, Any]] = []
    effects = Effects(
        {
            Delivered: [lambda e: seen.append(("a", e.seq)), lambda e: seen.append(("b", e.seq))],
            ViewsTracked: [lambda e: seen.append(("tracked", dict(e.positions)))],
        }
    )
    effects([delivered(1), ViewsTracked({0: 7}), object(), delivered(2)])  # type: ignore[list-item]
    assert seen == [("a", 1), ("b", 1), ("tracked", {0: 7}), ("a", 2), ("b", 2)]


def test_a_failing_handler_is_logged_and_the_next_effect_still_handled(caplog: pytest.LogCaptureFixture) -> None:
    hub, counts = Hub(pushes=3, fail_on=1), Counts()
    effects = Effects({Delivered: [push_online(hub, counts)]})
    with caplog.at_level(logging.ERROR, logger="fanout.effects"):
        effects([delivered(1), delivered(2)])
    assert hub.seen == [2] and counts.recorded == [("acme", "g", 2, 3)]
    assert "could not act on Delivered (the views are committed)" in caplog.text


def test_pushes_are_counted_only_when_some_socket_was_written() -> None:
    counts = Counts()
    Effects({Delivered: [push_online(Hub(pushes=0), counts)]})([delivered(1)])
    assert counts.recorded == []


def test_a_review_trigger_opens_a_review_by_its_key_and_says_so() -> None:
    calls: list[tuple[Any, ...]] = []
    opened: list[int] = []

    class App:
        def open_review(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            calls.append((*args, kwargs))
            return {}

    trigger = ReviewTrigger(tenant="acme", size_bucket="L", trigger="T1", details={"x": 1}, review_key="k1")
    Effects({ReviewTrigger: [open_review(App(), opened=lambda: opened.append(1))]})([trigger])
    assert calls == [("acme", "L", "T1", {"x": 1}, "capacity-monitor", {"review_key": "k1"})]
    assert opened == [1]
