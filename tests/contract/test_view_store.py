"""One contract for the view store (the read side a projection writes through and
everything else reads through: the ViewWriter, ViewReader and ViewStore ports), written
once and subclassed per backend: SQLite views with the RocksDB mailbox (real files),
and the in-memory backend; the Cassandra/Scylla backend of the distributed runtime must
pass the same suite. No mocks."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.cassandra.connect import open_cluster
from adapters.cassandra.mailbox import CassandraMailbox
from adapters.cassandra.mailbox_floors import COPY as FLOORS
from adapters.cassandra.schema import MAILBOX_TABLES, TABLES, create_schema
from adapters.cassandra.session_states import NO_SEQ, vouch
from adapters.cassandra.views import CassandraViews
from adapters.memory import MemoryViews
from fanout.bootstrap import open_views
from fanout.urls import cassandra_settings
from projections.ports import MessageRefs, ViewStore
from projections.sharding import shard_of
from projections.state import SessionHead, SessionState, UserConversationState, session_item, sessions_by_two_reads
from tests.engines import drop_keyspace, unique, with_path

T = "acme"


def head(cid: str, latest: int = 0, at: float = 1.0, policy: str = "always", tenant: str = T) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "aggregate_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{tenant}/{cid}")),
        "title": cid,
        "latest_conversation_seq": latest,
        "last_activity_id": f"m{latest}" if latest else None,
        "last_activity_at": at,
        "preview": f"p{latest}" if latest else None,
        "member_count": 2,
        "size_bucket": "small",
        "write_policy": policy,
        "broadcasts": 0,
        "created_at": 0.0,
        "position": latest,
    }


def message(cid: str, seq: int, pos: int) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "conversation_seq": seq,
        "message_id": f"m{seq}",
        "sender": "a",
        "text": f"text {seq}",
        "mentions": ["b"],
        "mention_all": False,
        "reply_to_seq": None,
        "announcement": False,
        "sent_at": float(seq),
        "pos": pos,
    }


def refs(cid: str, pos: int, seq: int, users: list[str]) -> MessageRefs:
    by: dict[int, list[str]] = {}
    for u in sorted(users):
        by.setdefault(shard_of(u, 16), []).append(u)
    return MessageRefs(cid, pos, seq, 0, {}, by)


def record(pos: int) -> dict[str, Any]:
    return {
        "message_id": "m1",
        "write_policy": "always",
        "member_count": 2,
        "mailbox_entries": 2,
        "shards": 2,
        "body_bytes": 6,
        "pos": pos,
    }


def fresh(read: int = 0) -> UserConversationState:
    return UserConversationState(read_conversation_seq=read, joined_seq=0)


class ViewStoreContract:
    def make(self, path: Path) -> ViewStore:
        raise NotImplementedError

    @pytest.fixture
    def views(self, tmp_path: Path) -> Iterator[Any]:
        v = self.make(tmp_path)
        yield v
        v.close()

    def test_a_unit_of_work_commits_its_writes_with_the_tracking_position(self, views: Any) -> None:
        with views.unit_of_work() as w:
            w.put_head(T, "c", head("c"))
            w.track("delivery", 7)
        assert views.position("delivery") == 7
        assert views.head(T, "c")["latest_conversation_seq"] == 0
        assert views.conversation_key(uuid.uuid5(uuid.NAMESPACE_URL, f"{T}/c")) == (T, "c")

    def test_a_failed_unit_of_work_writes_nothing_and_keeps_the_position(self, views: Any) -> None:
        with views.unit_of_work() as w:
            w.track("delivery", 1)
        with pytest.raises(RuntimeError), views.unit_of_work() as w:
            w.put_head(T, "c", head("c"))
            w.put_mailbox(T, refs("c", 2, 1, ["a", "b"]))
            w.track("delivery", 2)
            raise RuntimeError("crash in the middle")
        assert views.position("delivery") == 1
        assert views.head(T, "c") is None
        assert views.mailbox_page(T, "a", 0, 10) == []

    def test_member_states_round_trip_and_gap_updates_touch_only_the_gap(self, views: Any) -> None:
        a = UserConversationState(
            read_conversation_seq=3, joined_seq=1, last_active=9.5, mention_seqs=[4, 6], broadcast_base=1
        )
        with views.unit_of_work() as w:
            w.put_head(T, "c", head("c", 6))
            w.put_states(T, "c", [("a", a), ("b", UserConversationState(read_conversation_seq=0, joined_seq=0))])
        gap = UserConversationState(
            read_conversation_seq=99, joined_seq=99, delivered_conversation_seq=4, skipping=True, gap_end=None
        )
        with views.unit_of_work() as w:
            w.put_gaps(T, "c", [("a", gap)])
        _, states, _ = views.load_conversation(T, "c")
        assert states["a"] == UserConversationState(
            read_conversation_seq=3,
            joined_seq=1,
            last_active=9.5,
            delivered_conversation_seq=4,
            skipping=True,
            mention_seqs=[4, 6],
            broadcast_base=1,
        )
        with views.unit_of_work() as w:
            w.delete_state(T, "c", "b")
        assert set(views.load_conversation(T, "c")[1]) == {"a"}

    def test_the_delivery_record_is_materialized_at_commit_and_counts_pushes(self, views: Any) -> None:
        with views.unit_of_work(now=123.0) as w:
            w.put_head(T, "c", head("c", 1))
            w.put_message(T, "c", message("c", 1, 5))
            w.put_delivery(T, "c", 1, record(5))
            w.put_mailbox(T, refs("c", 5, 1, ["a", "b"]))
            w.track("delivery", 5)
        assert views.delivery(T, "c", 1)["online_pushes"] is None
        views.record_pushes(T, "c", 1, 3)
        views.record_pushes(T, "c", 1, 1)
        got = views.delivery(T, "c", 1)
        assert got["materialized_at"] == 123.0 and got["online_pushes"] == 4 and got["mailbox_entries"] == 2
        assert views.message(T, "c", 1)["mentions"] == ["b"]
        assert "pos" not in views.message(T, "c", 1)
        assert views.delivery(T, "c", 2) is None and views.message(T, "c", 2) is None

    def test_mailbox_entries_are_visible_only_up_to_the_committed_position(self, views: Any) -> None:
        with views.unit_of_work() as w:
            w.put_states(T, "c", [("a", fresh())])  # its join: a member's entries follow one
            w.put_mailbox(T, refs("c", 5, 1, ["a"]))
            w.track("delivery", 5)
        views.mailbox.write(T, refs("c", 9, 2, ["a"]))  # written, its views not yet committed
        assert [e[1] for e in views.mailbox_page(T, "a", 0, 10)] == [5]
        with views.unit_of_work() as w:
            w.track("delivery", 9)
        assert [e[1] for e in views.mailbox_page(T, "a", 0, 10)] == [5, 9]

    def test_the_login_read_is_two_reads_combined_in_activity_order_in_batches(self, views: Any) -> None:
        with views.unit_of_work() as w:
            for i, at in enumerate([5.0, 9.0, 1.0, 9.0]):
                cid = f"c{i}"
                w.put_head(T, cid, head(cid, latest=i + 1, at=at))
                w.put_states(T, cid, [("u", fresh())])
            w.put_head("other", "c0", head("c0", latest=7, at=99.0, tenant="other"))
            w.put_states("other", "c0", [("u", fresh())])
            w.put_states("other", "c9", [("u", fresh())])  # a state without a head
        states = views.user_states(T, "u")
        assert sorted(states) == ["c0", "c1", "c2", "c3"] and states["c1"] == fresh()
        batches = list(views.heads(T, sorted(states), 2))
        assert [len(b) for b in batches] == [2, 2]
        # most recent activity first, then by conversation id
        assert [h.conversation_id for b in batches for h in b] == ["c1", "c3", "c0", "c2"]
        assert batches[0][0] == SessionHead("c1", "always", 2, 0, "m2", 9.0, "p2")
        items = [session_item(h, SessionState.of(states[h.conversation_id])) for b in batches for h in b]
        assert [s["unread_count"] for s in items] == [2, 4, 1, 3]
        other = views.user_states("other", "u")
        assert [h.conversation_id for b in views.heads("other", list(other), 10) for h in b] == ["c0"]
        assert views.user_states(T, "nobody") == {} and list(views.heads(T, [], 5)) == []
        # sessions(): the same pairs in the same order and batches as the two reads give,
        # whichever way the backend answers it (a join, or the two reads)
        for tenant, user, size in ((T, "u", 2), (T, "u", 3), ("other", "u", 10), (T, "nobody", 5)):
            assert list(views.sessions(tenant, user, size)) == list(sessions_by_two_reads(views, tenant, user, size))
        assert [len(b) for b in views.sessions(T, "u", 3)] == [3, 1]

    def test_a_user_in_hundreds_of_conversations_gets_each_head_once_in_activity_order(self, views: Any) -> None:
        """More heads than one read request of a backend takes (Cassandra: 100 to an IN), and
        one without a head."""
        n = 250
        with views.unit_of_work() as w:
            for i in range(n):
                cid = f"c{i:03d}"
                w.put_head(T, cid, head(cid, latest=1, at=float((i * 7) % n)))
                w.put_states(T, cid, [("u", fresh())])
        asked = [f"c{i:03d}" for i in range(n)] + ["gone"]
        got = [h.conversation_id for b in views.heads(T, asked, 40) for h in b]
        assert len(got) == n and set(got) == {f"c{i:03d}" for i in range(n)}
        ats = [h.last_activity_at for b in views.heads(T, asked, 40) for h in b]
        assert ats == sorted(ats, reverse=True)
        assert [len(b) for b in views.sessions(T, "u", 40)] == [40] * 6 + [10]

    def test_sessions_count_personal_mentions_and_carry_the_gap(self, views: Any) -> None:
        gap = UserConversationState(
            read_conversation_seq=2, joined_seq=0, delivered_conversation_seq=1, skipping=True, mention_seqs=[3, 5]
        )
        with views.unit_of_work() as w:
            w.put_head(T, "c", head("c", latest=6))
            w.put_states(T, "c", [("u", gap)])
        ((h, st),) = next(iter(views.sessions(T, "u", 10)))
        assert st == SessionState(2, 1, True, None, 0, 2, 0)
        item = session_item(h, st)
        assert item["mention_count"] == 2 and item["unread_exact"] is False and item["delivered_conversation_seq"] == 1

    def test_reads_of_heads_by_scope_tenant_and_activity(self, views: Any) -> None:
        with views.unit_of_work() as w:
            w.put_head(T, "b", head("b"))
            w.put_head(T, "a", {**head("a"), "size_bucket": "large"})
            w.put_head("zeta", "z", head("z", tenant="zeta"))
            w.put_states(T, "b", [("u", UserConversationState(0, 0, last_active=4.0)), ("v", fresh())])
        assert views.heads_by_scope(T, "small") == ["b"] and views.heads_by_scope(T, "large") == ["a"]
        assert views.tenants() == [T, "zeta"]
        activity = [(t, c, bucket, sorted(actives)) for t, c, bucket, actives in views.conversation_activity(T)]
        assert activity == [(T, "a", "large", []), (T, "b", "small", [0.0, 4.0])]
        assert [c[:2] for c in views.conversation_activity(None)] == [(T, "a"), (T, "b"), ("zeta", "z")]
        assert list(views.conversation_activity(T, "large")) == [(T, "a", "large", [])]
        assert [c[:3] for c in views.conversation_activity(None, "small")] == [
            (T, "b", "small"),
            ("zeta", "z", "small"),
        ]
        assert list(views.conversation_activity("zeta", "medium")) == []
        assert views.head(T, "a")["tenant"] == T and views.head(T, "a")["size_bucket"] == "large"

    def test_a_head_put_without_its_lookups_is_still_found_by_them(self, views: Any) -> None:
        """ADR-0049: `lookups=False` says the aggregate id and the size bucket are as the views
        hold them; the head itself is written, and what it is found by stays right."""
        with views.unit_of_work() as w:
            w.put_head(T, "c", head("c"))
        with views.unit_of_work() as w:
            w.put_head(T, "c", head("c", latest=5, at=9.0), lookups=False)
        assert views.head(T, "c")["latest_conversation_seq"] == 5
        assert views.conversation_key(uuid.uuid5(uuid.NAMESPACE_URL, f"{T}/c")) == (T, "c")
        assert views.heads_by_scope(T, "small") == ["c"]
        with views.unit_of_work() as w:  # the bucket moves: put with its lookups
            w.put_head(T, "c", {**head("c", latest=6), "size_bucket": "large"})
            w.put_head(T, "c", {**head("c", latest=7), "size_bucket": "large"}, lookups=False)
        assert views.heads_by_scope(T, "small") == [] and views.heads_by_scope(T, "large") == ["c"]
        assert [c[:3] for c in views.conversation_activity(T)] == [(T, "c", "large")]

    def test_a_state_reads_as_its_row(self, views: Any) -> None:
        s = UserConversationState(read_conversation_seq=3, joined_seq=1, mention_seqs=[4, 6], skipping=True)
        with views.unit_of_work() as w:
            w.put_states(T, "c", [("a", s)])
        row = views.state(T, "a", "c")
        assert row["read_conversation_seq"] == 3 and row["mention_seqs"] == "4,6" and row["skipping"] == 1
        assert (row["tenant"], row["user_id"], row["conversation_id"]) == (T, "a", "c")
        assert views.state(T, "b", "c") is None

    def test_tracking_is_per_projection_and_partition(self, views: Any) -> None:
        assert views.position("delivery") == 0 and views.positions() == {}
        with views.unit_of_work() as w:
            w.track("delivery", 4)
            w.track("delivery", 9, partition=2)
            w.track("capacity", 4)
        assert views.positions() == {("delivery", 0): 4, ("delivery", 2): 9, ("capacity", 0): 4}
        assert views.position("delivery", 2) == 9

    def test_reviews_tiers_and_capacity_are_json_bodies(self, views: Any) -> None:
        with views.unit_of_work() as w:
            w.put_review({"review_id": "r1", "tenant": T, "status": "open"})
            w.put_review({"review_id": "r2", "tenant": T, "status": "open"})
            w.put_review({"review_id": "r3", "tenant": "other", "status": "open"})
            w.put_tier({"tier_id": "t", "enabled": True, "review_id": "r1"})
            w.put_capacity("capacity", {"applied": {0: 5}, "slots": [(1, {"x": 2})]})
        with views.unit_of_work() as w:
            w.put_review({"review_id": "r1", "tenant": T, "status": "decided"})
            w.put_tier({"tier_id": "t", "enabled": False})
        assert [(r["review_id"], r["status"]) for r in views.reviews(T)] == [("r2", "open"), ("r1", "decided")]
        assert views.review("r3")["tenant"] == "other"
        with pytest.raises(LookupError):
            views.review("nope")
        assert views.tier("t") == {"tier_id": "t", "enabled": False, "review_id": "r1"}  # merged
        assert views.tier("nope") is None
        assert views.capacity_state("capacity") == {"applied": {"0": 5}, "slots": [[1, {"x": 2}]]}
        assert views.capacity_state("nope") is None
        with pytest.raises(LookupError):
            views.conversation_key(uuid.uuid4())

    def test_a_unit_restricted_to_some_parts_keeps_only_their_writes(self, views: Any) -> None:
        with views.unit_of_work(frozenset({"state"})) as w:
            w.put_head(T, "c", head("c"))
            w.put_states(T, "c", [("a", fresh())])
            w.put_mailbox(T, refs("c", 1, 1, ["a"]))
            w.track("delivery", 1)
        assert views.head(T, "c") is None and views.state(T, "a", "c") is not None
        assert views.mailbox_page(T, "a", 0, 10) == [] and views.position("delivery") == 1

    def test_written_objects_are_copied_not_shared(self, views: Any) -> None:
        s = fresh()
        h = head("c")
        with views.unit_of_work() as w:
            w.put_head(T, "c", h)
            w.put_states(T, "c", [("a", s)])
            s.mention_seqs.append(7)  # the projection keeps mutating its working set
            h["latest_conversation_seq"] = 99
        assert views.user_states(T, "a")["c"].mention_seqs == []
        assert views.head(T, "c")["latest_conversation_seq"] == 0
        views.load_conversation(T, "c")[1]["a"].mention_seqs.append(8)
        assert views.load_conversation(T, "c")[1]["a"].mention_seqs == []

    def test_history_pages_in_seq_order(self, views: Any) -> None:
        with views.unit_of_work() as w:
            for seq in range(1, 6):
                w.put_message(T, "c", message("c", seq, seq))
        assert [m["conversation_seq"] for m in views.messages(T, "c", 2, 2)] == [3, 4]
        assert views.messages("other", "c", 0, 10) == []

    def test_a_unit_records_where_it_leaves_its_log_partition(self, views: Any) -> None:
        assert views.log_position(0) is None
        with views.unit_of_work() as w:
            w.track("delivery", 7)
            w.track_log(0, 7, 42)
        assert views.log_position(0) == (7, 42) and views.log_position(1) is None

    def test_a_log_position_read_ahead_answers_no_older_than_when_it_started(self, views: Any) -> None:
        before, other = views.log_position_later(0), views.log_position_later(1)
        assert other() is None
        assert before() is None  # nothing tracked when it started (a store may read later: still none)
        with views.unit_of_work() as w:
            w.track_log(0, 7, 42)
        started = views.log_position_later(0)
        with views.unit_of_work() as w:
            w.track_log(0, 9, 50)
        assert started() in ((7, 42), (9, 50))  # the unit after it started may or may not be seen
        assert views.log_position_later(0)() == (9, 50)

    def test_a_capacity_body_is_compared_and_set(self, views: Any) -> None:
        first = {"firing": {"T1": True}, "episodes": {"T1": 1}}
        assert views.compare_and_put_capacity("capacity.monitor", None, first)
        assert not views.compare_and_put_capacity("capacity.monitor", None, {"firing": {}})  # exists now
        second = {"firing": {"T1": False}, "episodes": {"T1": 1}}
        assert views.compare_and_put_capacity("capacity.monitor", first, second)
        stale = {"firing": {"T1": True}, "episodes": {"T1": 2}}
        assert not views.compare_and_put_capacity("capacity.monitor", first, stale)  # read before `second`
        assert views.capacity_state("capacity.monitor") == second

    def test_capacity_states_are_read_in_the_order_asked(self, views: Any) -> None:
        with views.unit_of_work() as w:
            for i in range(5):
                w.put_capacity(f"capacity.{i}", {"applied": {i: i}})
        names = ["capacity.3", "nope", "capacity.0", "capacity.4", "capacity.3"]
        assert views.capacity_states(names) == [views.capacity_state(n) for n in names]
        assert [s and s["applied"] for s in views.capacity_states(names)] == [
            {"3": 3},
            None,
            {"0": 0},
            {"4": 4},
            {"3": 3},
        ]
        assert views.capacity_states([]) == []


class PartitionedLogContract:
    """Stores built with partitions=2 (a log of two Kafka partitions): the mailbox is
    served up to the views' position, the position every partition has committed."""

    def make_partitioned(self, path: Path) -> ViewStore:
        raise NotImplementedError

    @pytest.fixture
    def views2(self, tmp_path: Path) -> Iterator[Any]:
        v = self.make_partitioned(tmp_path)
        yield v
        v.close()

    def test_the_mailbox_is_served_only_up_to_the_position_every_partition_committed(self, views2: Any) -> None:
        with views2.unit_of_work() as w:
            w.track("delivery", 5, partition=0)
        with views2.unit_of_work() as w:  # partition 1 commits ahead of partition 0
            w.put_states(T, "c", [("a", fresh())])
            w.put_mailbox(T, refs("c", 10, 1, ["a"]))
            w.track("delivery", 10, partition=1)
        assert views2.position("delivery", 1) == 10 and views2.views_position("delivery") == 5
        assert views2.mailbox_page(T, "a", 0, 10) == []  # partition 0 may still write below 10
        with views2.unit_of_work() as w:
            w.track("delivery", 9, partition=0)
        assert views2.mailbox_page(T, "a", 0, 10) == []
        with views2.unit_of_work() as w:
            w.track("delivery", 12, partition=0)
        assert views2.views_position("delivery") == 10
        assert [e[1] for e in views2.mailbox_page(T, "a", 0, 10)] == [10]

    def test_a_unit_spanning_partitions_stamps_each_row_with_its_own_partitions_position(self, views2: Any) -> None:
        """A worker's take is one unit over its partitions. A later unit of partition 0 alone
        reaches a lower position than the earlier unit did on partition 1: its rows still
        replace partition 0's (a store ordering writes by one stamp per unit would keep the
        older head: last-write-wins by the unit's highest position)."""
        with views2.unit_of_work() as w:
            w.applying(0, 0)
            w.put_head(T, "c0", head("c0", 1))
            w.put_message(T, "c0", message("c0", 1, 10))
            w.applying(1, 0)
            w.put_head(T, "c1", head("c1", 1))
            w.track("delivery", 10, partition=0)
            w.track_log(0, 10, -1)
            w.track("delivery", 100, partition=1)
            w.track_log(1, 100, -1)
        with views2.unit_of_work() as w:
            w.applying(0, 0)
            w.put_head(T, "c0", head("c0", 2))
            w.put_message(T, "c0", {**message("c0", 1, 10), "text": "edited by a later unit"})
            w.track("delivery", 20, partition=0)
            w.track_log(0, 20, -1)
        assert views2.head(T, "c0")["latest_conversation_seq"] == 2
        assert views2.message(T, "c0", 1)["text"] == "edited by a later unit"
        assert views2.head(T, "c1")["latest_conversation_seq"] == 1

    def test_a_partition_never_tracked_holds_the_views_position_at_zero(self, views2: Any) -> None:
        with views2.unit_of_work() as w:
            w.put_mailbox(T, refs("c", 3, 1, ["a"]))
            w.track("delivery", 3, partition=0)
        assert views2.views_position("delivery") == 0 and views2.mailbox_page(T, "a", 0, 10) == []


class TestSqliteViews(ViewStoreContract):
    def make(self, path: Path) -> ViewStore:
        return open_views(path, 16)  # with the RocksDB mailbox, as bootstrap opens them


class TestMemoryViews(ViewStoreContract, PartitionedLogContract):
    def make(self, path: Path) -> ViewStore:
        return MemoryViews()

    def make_partitioned(self, path: Path) -> ViewStore:
        return MemoryViews(partitions=2)


# -- Cassandra: one keyspace per test class, emptied before each store is made ------------


class CassandraKeyspace:
    """A keyspace on the running Cassandra with the views' and the mailbox's tables, and
    one session the stores of a test class share (keyspace creation costs seconds; a
    store made for a test starts from empty tables)."""

    def __init__(self, base_url: str, tables: tuple[str, ...] = (*TABLES, *MAILBOX_TABLES)) -> None:
        self.url = with_path(base_url, unique("t"))
        c = cassandra_settings(self.url)
        self.settings = c
        self.cluster, self.session = open_cluster(c.hosts, c.port, c.datacenter, c.consistency)
        create_schema(self.session, c.keyspace, c.replication, c.datacenter, tables)
        self.keyspace = c.keyspace
        rows = self.session.execute(
            "SELECT table_name, column_name, kind FROM system_schema.columns WHERE keyspace_name=%s", (c.keyspace,)
        )
        self.partition_keys: dict[str, list[str]] = {}
        for r in rows:
            if r["kind"] == "partition_key":
                self.partition_keys.setdefault(r["table_name"], []).append(r["column_name"])

    def clear(self) -> None:
        """Empty every table that has rows. TRUNCATE, not DELETE: the views stamp their
        writes with log positions above any wall-clock stamp (adapters/cassandra/stamps.py),
        so a DELETE at the driver's stamp would not remove them."""
        for table in self.partition_keys:
            if self.session.execute(f"SELECT * FROM {self.keyspace}.{table} LIMIT 1").one() is not None:
                self.session.execute(f"TRUNCATE {self.keyspace}.{table}", timeout=120)
        if "copies_complete" in self.partition_keys:  # empty user_states: its copy is complete (ADR-0043)
            vouch(self.session, self.keyspace)
            if "mailbox_floors" in self.partition_keys:  # and its floors (ADR-0045)
                vouch(self.session, self.keyspace, FLOORS)

    def mailbox(self, *, clear: bool = False) -> CassandraMailbox:
        if clear:
            self.clear()
        return CassandraMailbox(self.session, self.keyspace)

    def views(self, partitions: int = 1) -> CassandraViews:
        self.clear()
        return CassandraViews(self.session, self.keyspace, self.mailbox(), partitions=partitions)

    def close(self) -> None:
        self.cluster.shutdown()
        drop_keyspace(self.url)


class OnCassandra:
    """A contract's backend class on the running Cassandra: one keyspace for the class,
    emptied for each store it makes."""

    keyspace: CassandraKeyspace

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _keyspace(cls, engines: dict[str, str]) -> Iterator[None]:
        cls.keyspace = CassandraKeyspace(engines["FANOUT_VIEWS"])
        yield
        cls.keyspace.close()

    @classmethod
    def make(cls, path: Path) -> ViewStore:
        return cls.keyspace.views()


@pytest.fixture(scope="class")
def cassandra_keyspace(engines: dict[str, str]) -> Iterator[CassandraKeyspace]:
    ks = CassandraKeyspace(engines["FANOUT_VIEWS"])
    yield ks
    ks.close()


class TestCassandraViews(ViewStoreContract, PartitionedLogContract):
    @pytest.fixture(autouse=True)
    def _keyspace(self, cassandra_keyspace: CassandraKeyspace) -> None:
        self.ks = cassandra_keyspace

    def make(self, path: Path) -> ViewStore:
        return self.ks.views()

    def make_partitioned(self, path: Path) -> ViewStore:
        return self.ks.views(partitions=2)

    def test_a_users_mailbox_floor_is_the_lowest_above_of_the_units_that_put_its_states(self) -> None:
        """ADR-0045: whatever order units commit in (a stale one late, a replay), the floor a
        user keeps is the lowest `above` of any unit that put one of its state rows."""
        views = self.ks.views()
        try:
            for above in (50, 20, 80):
                with views.unit_of_work() as w:
                    w.applying(0, above)
                    w.put_states(T, f"c{above}", [("a", fresh())])
            with views.unit_of_work() as w:  # one unit over two partitions: the lower above
                w.applying(0, 7)
                w.put_states(T, "x", [("b", fresh())])
                w.applying(1, 3)
                w.put_states(T, "y", [("b", fresh())])
                w.put_gaps(T, "z", [("c", fresh())])  # a gap is no put: no floor
            rows = self.ks.session.execute(f"SELECT user_id, above FROM {self.ks.keyspace}.mailbox_floors")
            assert {r["user_id"]: r["above"] for r in rows} == {"a": 20, "b": 3}
        finally:
            views.close()

    def test_a_new_users_first_page_starts_at_its_floor_not_at_the_tenants_first_hour(self) -> None:
        """ADR-0045 (ADR-0038's cursor-0 cost): 40 hours of a tenant's history, one hour a
        request; a user who joined in the last hour reads its first page in one or two
        requests, not forty; where the floors are not vouched (a keyspace older than them) the
        read walks every hour as before, with the same page."""
        views = self.ks.views()
        views.mailbox.read_window = 1
        reads: list[int] = []

        class Counting:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
                if statement is views.mailbox._read:
                    reads.append(1)
                return self.inner.execute(statement, *args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

        def entry(pos: int, users: list[str]) -> MessageRefs:
            return dataclasses.replace(refs("c", pos, pos, users), at=(pos - 1) * 3600.0)  # an hour each

        try:
            with views.unit_of_work() as w:
                w.put_states(T, "c", [("old", fresh())])
                for pos in range(1, 41):
                    w.put_mailbox(T, entry(pos, ["old"]))
                w.track("delivery", 40)
            with views.unit_of_work() as w:  # the host's unit after position 40
                w.applying(0, 40)
                w.put_states(T, "c", [("new", fresh())])
                w.put_mailbox(T, entry(41, ["old", "new"]))
                w.track("delivery", 41)
            views.mailbox.session = Counting(views.mailbox.session)
            assert [e[1] for e in views.mailbox_page(T, "new", 0, 10)] == [41]
            assert 1 <= len(reads) <= 2
            del reads[:]
            assert views.mailbox_page(T, "nobody", 0, 10) == [] and reads == []  # no floor, no entry
            assert [e[1] for e in views.mailbox_page(T, "old", 0, 50)] == list(range(1, 42))
            self.ks.session.execute(f"DELETE FROM {self.ks.keyspace}.copies_complete WHERE copy=%s", (FLOORS,))
            unvouched = CassandraViews(self.ks.session, self.ks.keyspace, views.mailbox)
            del reads[:]
            assert [e[1] for e in unvouched.mailbox_page(T, "new", 0, 10)] == [41]
            assert len(reads) >= 40
        finally:
            views.close()

    def test_a_stale_unit_never_overwrites_a_newer_one(self) -> None:
        """ADR-0021: rows are stamped with the unit's log position; a unit that commits late
        (a paused worker) with an older position loses to what is there, deletes included,
        and the tracking never goes back."""
        views = self.ks.views()
        try:
            newer = fresh()
            newer.read_conversation_seq = 3
            with views.unit_of_work() as w:
                w.put_head(T, "c", head("c", 3))
                w.put_states(T, "c", [("a", newer)])
                w.delete_state(T, "c", "gone")
                w.put_delivery(T, "c", 1, record(5))
                w.track("delivery", 10)
                w.track_log(0, 10, 100)
            with views.unit_of_work() as w:  # the stale one, committed afterwards
                w.put_head(T, "c", head("c", 1))
                w.put_states(T, "c", [("a", fresh()), ("gone", fresh())])
                w.put_delivery(T, "c", 1, {**record(5), "mailbox_entries": 0})
                w.track("delivery", 6)
                w.track_log(0, 6, 60)
            assert views.head(T, "c")["latest_conversation_seq"] == 3
            _, states, _ = views.load_conversation(T, "c")
            assert set(states) == {"a"} and states["a"].read_conversation_seq == 3
            assert views.delivery(T, "c", 1)["mailbox_entries"] == 2
            assert views.position("delivery") == 10 and views.log_position(0) == (10, 100)
        finally:
            views.close()

    def test_two_replicas_pushing_one_message_count_every_push(self) -> None:
        """Each replica's count is a row of its own: racing replicas never lose a count."""
        import threading

        views = self.ks.views()
        other = CassandraViews(self.ks.session, self.ks.keyspace, self.ks.mailbox())
        try:
            with views.unit_of_work() as w:
                for seq in range(1, 21):
                    w.put_delivery(T, "c", seq, record(seq))
                w.track("delivery", 20)

            def push(store: CassandraViews) -> None:
                for _ in range(5):
                    for seq in range(1, 21):
                        store.record_pushes(T, "c", seq, 1)

            threads = [threading.Thread(target=push, args=(s,)) for s in (views, other, views, other)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert [views.delivery(T, "c", seq)["online_pushes"] for seq in range(1, 21)] == [20] * 20
        finally:
            views.close()

    def test_a_store_opened_from_the_url_creates_its_schema_twice_harmlessly_and_closes(
        self, fresh_cassandra: str
    ) -> None:
        c = cassandra_settings(fresh_cassandra)
        stores = [
            CassandraViews.from_settings(c, CassandraMailbox.from_settings(c), partitions=3) for _ in range(2)
        ]  # two openers racing on one keyspace: the second finds everything created
        try:
            with stores[0].unit_of_work() as w:
                w.put_head(T, "c", head("c", 1))
                w.put_states(T, "c", [("a", fresh())])
                w.put_mailbox(T, refs("c", 4, 1, ["a"]))
                for p in range(3):
                    w.track("delivery", 4, partition=p)
            assert stores[1].head(T, "c") is not None and stores[1].views_position("delivery") == 4
            assert [e[1] for e in stores[1].mailbox_page(T, "a", 0, 10)] == [4]
        finally:
            for s in stores:
                s.close()

    def test_member_rows_without_a_gap_hold_no_null_cells(self) -> None:
        """A null bound in an INSERT is a tombstone; two per member row made a 100k-member
        partition 200k tombstones, read on every load, and ran Cassandra out of heap (CI).
        'No seq' is stored as NO_SEQ; the contract tests above read it back as None."""
        views = self.ks.views()
        with views.unit_of_work() as w:
            w.put_head(T, "c", head("c", 2))
            w.put_states(T, "c", [("a", UserConversationState(read_conversation_seq=0, joined_seq=0))])
            w.put_gaps(T, "c", [("a", UserConversationState(read_conversation_seq=0, joined_seq=0, skipping=True))])
        for table in ("conversation_states", "user_states"):
            row = self.ks.session.execute(f"SELECT * FROM {self.ks.keyspace}.{table}").one()
            assert row is not None
            assert [c for c, v in row.items() if v is None] == []
            assert (row["delivered_conversation_seq"], row["gap_end"]) == (NO_SEQ, NO_SEQ)
        assert views.load_conversation(T, "c")[1]["a"].delivered_conversation_seq is None

    def test_a_process_using_the_store_exits_promptly(self, fresh_cassandra: str) -> None:
        """close() shuts the cluster down and no reactor thread keeps the process alive."""
        import subprocess
        import sys
        import time

        code = (
            "from adapters.cassandra.mailbox import CassandraMailbox\n"
            "from adapters.cassandra.views import CassandraViews\n"
            "from fanout.urls import cassandra_settings\n"
            f"c = cassandra_settings({fresh_cassandra!r})\n"
            "v = CassandraViews.from_settings(c, CassandraMailbox.from_settings(c))\n"
            "assert v.position('delivery') == 0\n"
            "v.close()\n"
        )
        root = Path(__file__).resolve().parents[2]
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 20  # libev joins its loop thread up to 5 s at exit


def test_views_written_before_the_adr_column_names_are_migrated_in_place(tmp_path: Path) -> None:
    """A views file of schema 0 (states.read_seq, states.delivered_seq) opens, keeps its
    rows under the new names, and is marked with the current schema version."""
    import sqlite3

    from adapters.sqlite.schema import VIEWS_SCHEMA_VERSION

    con = sqlite3.connect(tmp_path / "views.sqlite")
    con.execute(
        "CREATE TABLE states (tenant TEXT NOT NULL, user_id TEXT NOT NULL, conversation_id TEXT NOT NULL, "
        "read_seq INTEGER NOT NULL, joined_seq INTEGER NOT NULL, last_active REAL NOT NULL, delivered_seq INTEGER, "
        "skipping INTEGER NOT NULL, gap_end INTEGER, rebuilt_seq INTEGER NOT NULL, mention_seqs TEXT NOT NULL, "
        "broadcast_base INTEGER NOT NULL, PRIMARY KEY (tenant, user_id, conversation_id)) WITHOUT ROWID"
    )
    con.execute("INSERT INTO states VALUES ('acme', 'a', 'c', 3, 1, 9.5, 2, 1, NULL, 0, '4', 0)")
    con.commit()
    con.close()
    for _ in range(2):  # and a second open changes nothing
        views = open_views(tmp_path, 16)
        try:
            state = views.state(T, "a", "c")
            assert state is not None
            assert state["read_conversation_seq"] == 3 and state["delivered_conversation_seq"] == 2
        finally:
            views.close()
    con = sqlite3.connect(tmp_path / "views.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == VIEWS_SCHEMA_VERSION
    con.close()
