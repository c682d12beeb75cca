"""One contract for the MailboxStore port, run against every backend (STYLE: a
view store is a port with one contract suite): RocksDB and SQLite on real files, and
the in-memory store. No mocks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from adapters.cassandra.mailbox import CassandraMailbox
from adapters.cassandra.schema import MAILBOX_TABLES
from adapters.memory import MemoryMailbox
from adapters.rocksdb.mailbox import RocksMailbox, ShardCountMismatch
from adapters.sqlite.mailbox import SqliteMailbox
from projections.ports import MailboxStore, MessageRefs
from projections.sharding import shard_of
from tests.contract.test_view_store import CassandraKeyspace

SHARDS = 4


def refs(
    cid: str,
    pos: int,
    seq: int,
    users: list[str],
    flags: int = 0,
    special: dict[str, int] | None = None,
    at: float = 0.0,
    versions: dict[int, int] | None = None,
) -> MessageRefs:
    by: dict[int, list[str]] = {}
    for u in sorted(users):
        by.setdefault(shard_of(u, SHARDS), []).append(u)
    return MessageRefs(cid, pos, seq, flags, special or {}, by, versions, at=at)


class MailboxContract:
    """Subclass per backend and implement `make`."""

    records_written = True  # written() says how far the writes reach (Cassandra: None, ADR-0021 heals)

    def make(self, path: Path) -> MailboxStore:
        raise NotImplementedError

    @pytest.fixture
    def store(self, tmp_path: Path) -> Any:
        s = self.make(tmp_path / "mailbox")
        yield s
        s.close()

    def test_written_is_the_highest_message_position_written(self, store: MailboxStore) -> None:
        """The mark the embedded runtime's start compares with its views (ADR-0056); a store
        that does not record it says None."""
        assert store.written() is None
        store.write("t", refs("c", 7, 2, ["a"]))
        store.write("t", refs("c", 4, 1, ["b"]))  # an earlier message written again (a replay)
        assert store.written() == (7 if self.records_written else None)

    def test_an_entry_is_read_back_by_user_in_pos_order(self, store: MailboxStore) -> None:
        store.write("t", refs("c1", 5, 1, ["alice", "bob"]))
        store.write("t", refs("c2", 9, 1, ["alice"]))
        assert store.read("t", "alice", 0, 100, 10) == [("alice", 5, 1, "c1", 0), ("alice", 9, 1, "c2", 0)]
        assert store.read("t", "bob", 0, 100, 10) == [("bob", 5, 1, "c1", 0)]

    def test_the_cursor_is_exclusive_and_the_upper_bound_inclusive(self, store: MailboxStore) -> None:
        for pos in range(1, 6):
            store.write("t", refs("c", pos, pos, ["u"]))
        assert [e[1] for e in store.read("t", "u", 2, 4, 10)] == [3, 4]
        assert [e[1] for e in store.read("t", "u", 0, 5, 2)] == [1, 2]
        assert store.read("t", "u", 5, 5, 10) == []

    def test_writing_the_same_refs_twice_stores_them_once(self, store: MailboxStore) -> None:
        r = refs("c", 3, 1, [f"u{i}" for i in range(50)], special={"u7": 1})
        store.write("t", r)
        store.write("t", r)
        assert store.count() == 50
        assert store.read("t", "u7", 0, 10, 10) == [("u7", 3, 1, "c", 1)]

    def test_special_users_get_their_own_flags(self, store: MailboxStore) -> None:
        store.write("t", refs("c", 1, 1, ["a", "b", "s"], flags=8, special={"s": 16 | 8, "b": 1 | 8}))
        got = {e[0]: e[4] for u in "abs" for e in store.read("t", u, 0, 10, 10)}
        assert got == {"a": 8, "b": 9, "s": 24}

    def test_tenants_and_users_sharing_a_prefix_never_see_each_other(self, store: MailboxStore) -> None:
        store.write("ab", refs("c", 1, 1, ["u"]))
        store.write("a", refs("c", 2, 1, ["bu", "u1", "u"]))
        assert [e[1] for e in store.read("a", "u", 0, 10, 10)] == [2]
        assert [e[1] for e in store.read("ab", "u", 0, 10, 10)] == [1]
        assert [e[1] for e in store.read("a", "u1", 0, 10, 10)] == [2]

    def test_all_entries_lists_every_entry_with_its_tenant(self, store: MailboxStore) -> None:
        store.write("t1", refs("c", 1, 1, ["x", "y"]))
        store.write("t2", refs("d", 2, 7, ["x"], special={"x": 16}))
        assert sorted(store.all_entries()) == [
            ("t1", "x", 1, 1, "c", 0),
            ("t1", "y", 1, 1, "c", 0),
            ("t2", "x", 2, 7, "d", 16),
        ]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.differing_executors])
    @given(
        writes=st.lists(
            st.tuples(
                st.sampled_from(["t", "u"]),
                st.sets(st.sampled_from(["a", "b", "ab", "b\u00e9", "z9"]), min_size=1),
                st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.5, 2.0, 30.0]),  # hours since the previous send
                st.floats(-0.99, 0.99),  # the accepting replica's clock error, in hours
            ),
            min_size=1,
            max_size=16,
        ),
        after=st.integers(0, 18),
        until=st.integers(0, 18),
        limit=st.integers(1, 5),
    )
    # clock errors that put a later position an hour, then two hours, before an earlier one
    @example(writes=[("t", {"a"}, 0.5, 0.0), ("u", {"a"}, 0.0, 0.5), ("u", {"a"}, 0.0, 0.0)], after=0, until=3, limit=1)
    @example(
        writes=[("t", {"a"}, 1.5, 0.99), ("t", {"a"}, 0.0, -0.99), ("t", {"a"}, 0.0, -0.3)], after=0, until=3, limit=1
    )
    def test_reads_equal_a_reference_model(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        writes: list[tuple[str, set[str], float, float]],
        after: int,
        until: int,
        limit: int,
    ) -> None:
        """Any sends, each accepted some hours after the last by a replica whose clock is off by
        up to an hour (a store may key by the message's time: Cassandra's hours, ADR-0038)."""
        store = self.make(tmp_path_factory.mktemp("model") / "mailbox")
        try:
            model: dict[tuple[str, str], list[int]] = {}
            now = 472_222 * 3600.0  # on an hour
            for pos, (tenant, users, hours, skew) in enumerate(writes, start=1):
                now += hours * 3600
                store.write(tenant, refs("c", pos, pos, sorted(users), at=now + skew * 3600))
                for u in users:
                    model.setdefault((tenant, u), []).append(pos)
            for (tenant, u), positions in model.items():
                expected = [p for p in positions if after < p <= until][:limit]
                assert [e[1] for e in store.read(tenant, u, after, until, limit)] == expected
        finally:
            store.close()


class TestRocksMailbox(MailboxContract):
    def make(self, path: Path) -> MailboxStore:
        return RocksMailbox(path, SHARDS)

    def test_reopening_with_another_shard_count_is_refused_with_what_to_do(self, tmp_path: Path) -> None:
        RocksMailbox(tmp_path / "m", 4).close()
        with pytest.raises(ShardCountMismatch, match="FANOUT_MAILBOX_SHARDS=8.*rebuild mailbox"):
            RocksMailbox(tmp_path / "m", 8)

    def test_entries_survive_a_reopen(self, tmp_path: Path) -> None:
        s = RocksMailbox(tmp_path / "m", SHARDS)
        s.write("t", refs("c", 1, 1, ["a"]))
        s.close()
        s = RocksMailbox(tmp_path / "m", SHARDS)
        assert s.read("t", "a", 0, 5, 5) == [("a", 1, 1, "c", 0)]
        assert s.written() == 1
        s.close()


class TestSqliteMailbox(MailboxContract):
    def make(self, path: Path) -> MailboxStore:
        return SqliteMailbox(path.with_suffix(".sqlite"))


class TestMemoryMailbox(MailboxContract):
    def make(self, path: Path) -> MailboxStore:
        return MemoryMailbox()


@pytest.fixture(scope="class")
def mailbox_keyspace(engines: dict[str, str]) -> Iterator[CassandraKeyspace]:
    ks = CassandraKeyspace(engines["FANOUT_VIEWS"], MAILBOX_TABLES)
    yield ks
    ks.close()


class TestCassandraMailbox(MailboxContract):
    """On the running Cassandra: one keyspace for the class, emptied for each store."""

    records_written = False

    @pytest.fixture(autouse=True)
    def _keyspace(self, mailbox_keyspace: CassandraKeyspace) -> None:
        self.ks = mailbox_keyspace

    def make(self, path: Path) -> MailboxStore:
        store = self.ks.mailbox(clear=True)
        store.read_window = 1  # a cursor read stops as early as it can: every stop is exercised
        return store

    def test_a_message_to_many_members_is_written_in_grouped_batches(self) -> None:
        """Thousands of members: every entry lands once, in UNLOGGED batches of
        BATCH_ROWS rows (not a round trip per member), and a second write adds nothing."""
        from adapters.cassandra import mailbox as cassandra_mailbox

        store = self.make(Path("unused"))
        users = [f"user{i:05d}" for i in range(5000)]
        r = refs("big", 7, 3, users, flags=0, special={"user00042": 1})
        batches = list(store.batches("t", r))  # type: ignore[attr-defined]
        assert len(batches) <= len(users) // cassandra_mailbox.BATCH_ROWS + SHARDS
        assert store.write("t", r) == 5000 and store.write("t", r) == 5000
        assert store.count() == 5000
        assert store.read("t", "user00042", 0, 7, 5) == [("user00042", 7, 3, "big", 1)]
        assert store.read("t", "user04999", 0, 6, 5) == []

    def test_a_large_member_list_cached_by_version_follows_joins_and_leaves(self) -> None:
        """A MailboxShard list of CACHED_LIST members or more is grouped by partition once per
        version (ADR-0038): a join or a leave (a new version of that list) is seen by the next
        message, and a special member's flags still come per message."""
        from adapters.cassandra.mailbox import CACHED_LIST

        store = self.make(Path("unused"))
        users = [f"m{i:05d}" for i in range(CACHED_LIST * SHARDS + 50)]
        versions = dict.fromkeys(range(SHARDS), 1)
        store.write("t", refs("big", 1, 1, users, versions=versions, special={"m00003": 1}))
        joined = [*users, "zz-new"]
        versions = {**versions, shard_of("zz-new", SHARDS): 2}
        store.write("t", refs("big", 2, 2, joined, versions=versions))
        left = [u for u in joined if u != "m00007"]
        versions = {**versions, shard_of("m00007", SHARDS): 3}
        store.write("t", refs("big", 3, 3, left, versions=versions, special={"m00009": 16}))
        assert [e[1] for e in store.read("t", "zz-new", 0, 9, 9)] == [2, 3]
        assert [e[1] for e in store.read("t", "m00007", 0, 9, 9)] == [1, 2]
        assert [(e[1], e[4]) for e in store.read("t", "m00003", 0, 9, 9)] == [(1, 1), (2, 0), (3, 0)]
        assert [(e[1], e[4]) for e in store.read("t", "m00009", 0, 9, 9)] == [(1, 0), (2, 0), (3, 16)]
        assert store.count() == 3 * len(users) + 1  # the joiner in two messages, the leaver in two

    def test_a_cursor_read_over_many_hours_reads_several_hours_a_request(self) -> None:
        """40 hours of history, some hours empty for the reader: every window size and limit
        gives the first entries after the cursor, in order (ADR-0038: `hour IN` a request)."""
        store = self.make(Path("unused"))
        base = 472_222 * 3600.0
        mine = []
        for pos in range(1, 81):  # two sends an hour; the reader in every third
            users = ["other", "me"] if pos % 3 == 0 else ["other"]
            store.write("t", refs("c", pos, pos, users, at=base + (pos // 2) * 3600 + 7))
            if pos % 3 == 0:
                mine.append(pos)
        for window in (1, 2, 5, 32):
            store.read_window = window  # type: ignore[attr-defined]
            for after in (0, 10, 59, 80):
                for limit in (1, 3, 100):
                    expected = [p for p in mine if p > after][:limit]
                    assert [e[1] for e in store.read("t", "me", after, 80, limit)] == expected, (window, after, limit)

    def test_a_mailbox_opened_from_the_url_creates_its_table_and_closes(self, fresh_cassandra: str) -> None:
        from fanout.urls import cassandra_settings

        store = CassandraMailbox.from_settings(cassandra_settings(fresh_cassandra))
        try:
            store.write("t", refs("c", 1, 1, ["a"]))
            assert store.read("t", "a", 0, 1, 1) == [("a", 1, 1, "c", 0)]
        finally:
            store.close()
