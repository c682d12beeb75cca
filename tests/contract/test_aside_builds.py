"""One contract for the AsideBuilds port (projections/ports.py): what `fanout rebuild` and
`fanout verify` do on an engine, views built aside under a NAME, compared with the live
views and swapped into them. Written once and run against SQLite + RocksDB (real files in a
data dir) and Cassandra (the running engine, a keyspace per test). The live views and the
views built aside are written by the real projection host from one log (tests/host_log.py);
the live views are then damaged through their own ports (a spurious mailbox entry, a
spurious member state: new keys, so no engine's write ordering can hide them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adapters.cassandra.rebuild import CassandraAsideBuilds
from adapters.sqlite.rebuild import SqliteAsideBuilds
from fanout.bootstrap import open_cassandra_views, open_views, rebuild_host
from fanout.urls import cassandra_settings
from projections.delivery import DeliveryProjection
from projections.ports import ALL_TARGETS, AsideBuilds, MessageRefs, StaleAside, ViewStore
from projections.state import UserConversationState
from tests.engines import drop_keyspace, unique, with_path
from tests.host_log import PARAMS, LogBuilder, written_log

NAME = "verify_contract"
SPURIOUS_USER = "intruder"


@pytest.fixture(scope="module")
def log() -> Iterator[LogBuilder]:
    with written_log() as b:
        yield b


def project(log: LogBuilder, views: ViewStore, until: int | None = None) -> int:
    runner = rebuild_host(log.app, views, PARAMS, until=until)
    runner.catch_up()
    return runner.position()


def damage_mailbox(views: ViewStore) -> None:
    views.mailbox.write("acme", MessageRefs("c0", 1, 1, 0, {}, {0: [SPURIOUS_USER]}))


def damage_states(views: ViewStore) -> None:
    with views.unit_of_work() as w:
        w.put_states("acme", "c0", [(SPURIOUS_USER, UserConversationState(read_conversation_seq=0, joined_seq=0))])


def spurious(views: ViewStore) -> tuple[int, bool]:
    """(the intruder's mailbox entries, whether the intruder has a state in c0)."""
    entries = len(views.mailbox.read("acme", SPURIOUS_USER, 0, 1 << 62, 100))
    return entries, views.state("acme", SPURIOUS_USER, "c0") is not None


class AsideBuildsContract:
    """`live()` opens the live views (again, after a swap closed them); `aside` is the port."""

    aside: AsideBuilds
    live: Callable[[], ViewStore]

    def built(self, log: LogBuilder, name: str = NAME, until: int | None = None) -> int:
        store = self.aside.open(name)
        try:
            return project(log, store, until)
        finally:
            store.close()

    def test_views_built_aside_from_the_same_log_equal_the_live_ones(self, log: LogBuilder) -> None:
        top = project(log, self.live())
        assert top > 50
        assert self.built(log) == top
        d = self.aside.diff(NAME, limit=5)
        assert d.differences == {} and d.counts == {}
        assert d.positions == (top, top)
        assert set(d.rows) == set(self.aside.tables)
        assert d.rows["mailbox"] == self.live().mailbox.count() > 0
        assert self.aside.positions(NAME) == self.aside.positions()
        assert self.aside.positions()[(DeliveryProjection.name, 0)] == top

    def test_the_diff_names_each_damaged_row_on_its_side(self, log: LogBuilder) -> None:
        live = self.live()
        project(log, live)
        damage_mailbox(live)
        damage_states(live)
        self.built(log)
        d = self.aside.diff(NAME, limit=5)
        assert d.counts["mailbox"] == (1, 0)
        assert any(SPURIOUS_USER in row for row in d.differences["mailbox"][0])
        assert d.differences["mailbox"][1] == []
        # the member state, in each table its engine keeps it in (Cassandra: two, by user and by conversation)
        states = set(d.counts) - set(self.aside.tables_of(frozenset({"mailbox"})))  # Cassandra: its hours too
        assert states and states <= set(self.aside.tables_of(frozenset({"state"})))
        assert all(d.counts[t] == (1, 0) for t in states)

    def test_a_diff_shows_at_most_limit_rows_but_counts_them_all(self, log: LogBuilder) -> None:
        live = self.live()
        project(log, live)
        for pos in range(1, 8):
            live.mailbox.write("beta", MessageRefs("c1", pos, pos, 0, {}, {0: [SPURIOUS_USER]}))
        self.built(log)
        d = self.aside.diff(NAME, limit=3)
        assert d.counts["mailbox"] == (7, 0)
        assert len(d.differences["mailbox"][0]) == 3

    def test_open_removes_what_a_crashed_build_left_under_the_name(self, log: LogBuilder) -> None:
        top = project(log, self.live())
        assert self.built(log, until=top // 2) == top // 2
        store = self.aside.open(NAME)
        try:
            assert store.position(DeliveryProjection.name) == 0
            assert store.mailbox.count() == 0
        finally:
            store.close()

    def test_a_swap_of_everything_puts_the_build_in_place_of_the_damaged_views(self, log: LogBuilder) -> None:
        live = self.live()
        project(log, live)
        clean = live.mailbox.count()
        damage_mailbox(live)
        damage_states(live)
        self.built(log)
        swapped = self.aside.swap(NAME, ALL_TARGETS, self.aside.positions())
        assert set(swapped) == set(self.aside.tables_of(ALL_TARGETS)) and "mailbox" in swapped
        assert swapped["mailbox"].rows == clean
        assert spurious(self.live()) == (0, False)
        self.built(log)
        assert self.aside.diff(NAME, limit=5).differences == {}

    def test_a_swap_of_the_states_leaves_the_mailbox_as_it_was(self, log: LogBuilder) -> None:
        live = self.live()
        project(log, live)
        damage_mailbox(live)
        damage_states(live)
        self.built(log, until=None)
        swapped = self.aside.swap(NAME, frozenset({"state"}), self.aside.positions())
        assert "mailbox" not in swapped and set(swapped) == set(self.aside.tables_of(frozenset({"state"})))
        assert spurious(self.live()) == (1, False)

    def test_a_swap_when_the_live_views_moved_is_refused_and_swaps_nothing(self, log: LogBuilder) -> None:
        live = self.live()
        top = project(log, live)
        damage_mailbox(live)
        damage_states(live)
        self.built(log)
        moved = dict(self.aside.positions())
        moved[(DeliveryProjection.name, 0)] = top + 1
        for targets in (ALL_TARGETS, frozenset({"state"}), frozenset({"mailbox"})):
            with pytest.raises(StaleAside):
                self.aside.swap(NAME, targets, moved)
        assert spurious(self.live()) == (1, True)

    def test_a_swap_keeps_the_runtime_facts_of_the_live_delivery_records(self, log: LogBuilder) -> None:
        live = self.live()
        project(log, live)
        live.record_pushes("acme", "c0", 1, 3)
        before = live.delivery("acme", "c0", 1)
        assert before is not None and before["online_pushes"] == 3
        self.built(log)
        self.aside.swap(NAME, ALL_TARGETS, self.aside.positions())
        after = self.live().delivery("acme", "c0", 1)
        assert after is not None
        assert (after["online_pushes"], after["materialized_at"]) == (3, before["materialized_at"])

    def test_remove_deletes_the_build_and_leaves_the_live_views(self, log: LogBuilder) -> None:
        top = project(log, self.live())
        self.built(log)
        self.aside.remove(NAME)
        self.aside.remove(NAME)  # nothing left: no error
        assert self.aside.positions()[(DeliveryProjection.name, 0)] == top
        assert self.live().mailbox.count() > 0


class TestSqliteAndRocksDb(AsideBuildsContract):
    @pytest.fixture(autouse=True)
    def _data_dir(self, tmp_path: Path) -> Iterator[None]:
        aside = SqliteAsideBuilds(
            tmp_path,
            open_views(tmp_path, PARAMS.mailbox_shards),
            lambda prefix: open_views(tmp_path, PARAMS.mailbox_shards, prefix=prefix),
        )
        self.aside, self.live = aside, aside.live  # a swap of whole stores reopens them
        yield
        aside.live().close()
        aside.close()


class TestCassandra(AsideBuildsContract):
    @pytest.fixture(autouse=True)
    def _keyspace(self, engines: dict[str, str]) -> Iterator[None]:
        url = with_path(engines["FANOUT_VIEWS"], unique("a"))
        settings = cassandra_settings(url)
        live = open_cassandra_views(settings, partitions=1)

        def other(keyspace: str) -> ViewStore:
            return open_cassandra_views(dataclasses.replace(settings, keyspace=keyspace), partitions=1)

        self.aside = CassandraAsideBuilds(live.session, live.keyspace, other)
        self.live = lambda: live
        try:
            yield
        finally:
            try:
                self.aside.remove(NAME)
            finally:
                live.close()
                drop_keyspace(url)
