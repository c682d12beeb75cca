"""A host with an event loop (Faust) must not block it on store reads: every projection
splits its reads off process() into missing()/load(), which the host runs in an
executor. Proven here on the real SQLite views: with the loads done ahead, process()
of every event of a log reads nothing from the store; after forget() (a revoked
partition) the working sets are loaded again, and the result is the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.sqlite.views import SqliteViews
from fanout.bootstrap import open_views
from projections.hosting import build_projections
from tests.contract.test_projection_replay import PARAMS, build_log, snapshot


class Guarded:
    """The views, with reads refused while `forbid` is set (writes go through the writer)."""

    def __init__(self, views: SqliteViews) -> None:
        self._views = views
        self.forbid = False
        self.reads = 0

    def unit_of_work(self, *a: Any, **kw: Any) -> Any:
        return self._views.unit_of_work(*a, **kw)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._views, name)
        if not callable(attr):
            return attr

        def read(*a: Any, **kw: Any) -> Any:
            if self.forbid:
                raise AssertionError(f"process() read the store: {name}{a}")
            self.reads += 1
            return attr(*a, **kw)

        return read


def run(store: Guarded, log: list[tuple[int, Any]], forget_every: int = 0) -> None:
    """Units of work of `forget_every` events (all in one when 0); with forget_every, the
    working sets are dropped between units, as a revoked and reassigned partition would."""
    projections = build_projections(store, PARAMS)  # type: ignore[arg-type]
    size = forget_every or len(log)
    for start in range(0, len(log), size):
        if forget_every:
            for p in projections:
                p.forget()
        unit = log[start : start + size]
        with store.unit_of_work() as w:
            for position, event in unit:
                for p in projections:
                    if type(event) not in p.topics:
                        continue
                    if p.missing(event):
                        p.load(event)  # an asyncio host: await loop.run_in_executor(None, p.load, event)
                    store.forbid = True
                    try:
                        p.process(event, position, w)
                    finally:
                        store.forbid = False
            for p in projections:
                p.flush(w)
                w.track(p.name, unit[-1][0])


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, Any]]:
    return build_log(tmp_path_factory.mktemp("log"))


def test_with_loads_done_ahead_process_reads_nothing(log: list[tuple[int, Any]], tmp_path: Path) -> None:
    views = open_views(tmp_path / "a", PARAMS.mailbox_shards)
    try:
        store = Guarded(views)
        run(store, log)
        assert store.reads > 0  # the loads happened, apart from process()
    finally:
        views.close()


def test_forgetting_working_sets_reloads_them_with_the_same_result(log: list[tuple[int, Any]], tmp_path: Path) -> None:
    once, again = open_views(tmp_path / "once", 4), open_views(tmp_path / "again", 4)
    try:
        run(Guarded(once), log)
        run(Guarded(again), log, forget_every=3)
        assert snapshot(again) == snapshot(once)
    finally:
        once.close()
        again.close()
