"""Fixtures of the invariant tests: a real embedded runtime on a temporary data dir,
driven by a fake clock, projected synchronously (runner.catch_up(), never start())."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from domain.params import Parameters
from fanout.bootstrap import bootstrap
from fanout.clock import FakeClock
from fanout.config import Settings


class Harness:
    """An EmbeddedRuntime that can be closed and reopened on the same data dir."""

    def __init__(self, data_dir: Path, params: Parameters, clock: FakeClock) -> None:
        self.data_dir = data_dir
        self.params = params
        self.clock = clock
        self.rt = bootstrap(Settings.embedded(data_dir, params), clock=clock)

    @property
    def app(self):  # noqa: ANN201
        return self.rt.app

    @property
    def queries(self):  # noqa: ANN201
        return self.rt.queries

    def settle(self) -> None:
        """Project the whole log in this thread: deterministic, no background runner."""
        self.rt.runner.catch_up()

    def restart(self) -> None:
        self.rt.close()
        self.rt = bootstrap(Settings.embedded(self.data_dir, self.params), clock=self.clock)
        self.settle()

    def log_top(self) -> int:
        return self.rt.app.recorder.max_notification_id() or 0

    def close(self) -> None:
        self.rt.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_harness(tmp_path: Path, clock: FakeClock) -> Iterator:
    made: list[Harness] = []

    def make(params: Parameters) -> Harness:
        h = Harness(tmp_path / f"data{len(made)}", params, clock)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
