"""One contract for the view store (the read side a projection writes through and
everything else reads through: the ViewWriter, ViewReader and ViewStore ports), written
once and subclassed per backend: SQLite views with the RocksDB mailbox (real files),
and the in-memory backend; the Cassandra/Scylla backend of the distributed runtime must
pass the same suite. No mocks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.memory import MemoryViews
from fanout.bootstrap import open_views
from projections.ports import MessageRefs, ViewStore
from projections.sharding import shard_of
from projections.state import SessionHead, SessionState, UserConversationState, session_item, sessions_by_two_reads

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
        assert views.head(T, "a")["tenant"] == T and views.head(T, "a")["size_bucket"] == "large"

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


class TestSqliteViews(ViewStoreContract):
    def make(self, path: Path) -> ViewStore:
        return open_views(path, 16)  # with the RocksDB mailbox, as bootstrap opens them


class TestMemoryViews(ViewStoreContract):
    def make(self, path: Path) -> ViewStore:
        return MemoryViews()


def test_views_written_before_the_adr_column_names_are_migrated_in_place(tmp_path: Path) -> None:
    """A views file of schema 0 (states.read_seq, states.delivered_seq) opens, keeps its
    rows under the new names, and is marked with the current schema version."""
    import sqlite3

    from adapters.sqlite_views import VIEWS_SCHEMA_VERSION

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
