"""A revoked partition drops the projections' working sets (`forget()`); whoever is
assigned the partition next loads them again from the committed views. Proven here on the
real SQLite views: a log folded in units, with the working sets dropped between them,
leaves the same views as the log folded in one unit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout.bootstrap import open_views
from projections.hosting import build_projections
from projections.ports import ViewStore
from tests.contract.test_projection_replay import PARAMS, build_log, snapshot


def run(store: ViewStore, log: list[tuple[int, Any]], forget_every: int = 0) -> None:
    """Units of work of `forget_every` events (all in one when 0); with forget_every, the
    working sets are dropped between units, as a revoked and reassigned partition would."""
    projections = build_projections(store, PARAMS)
    size = forget_every or len(log)
    for start in range(0, len(log), size):
        if forget_every:
            for p in projections:
                p.forget()
        unit = log[start : start + size]
        with store.unit_of_work() as w:
            for position, event in unit:
                for p in projections:
                    if type(event) in p.topics:
                        p.process(event, position, w)
            for p in projections:
                p.flush(w)
                w.track(p.name, unit[-1][0])


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, Any]]:
    return build_log(tmp_path_factory.mktemp("log"))


def test_forgetting_working_sets_reloads_them_with_the_same_result(log: list[tuple[int, Any]], tmp_path: Path) -> None:
    once, again = open_views(tmp_path / "once", 4), open_views(tmp_path / "again", 4)
    try:
        run(once, log)
        run(again, log, forget_every=3)
        assert snapshot(again) == snapshot(once)
    finally:
        once.close()
        again.close()
