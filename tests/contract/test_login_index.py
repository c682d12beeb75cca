"""The login of one history is the same on every backend, item by item (ADR-0028).

Cassandra answers the first SESSION_LIST_BATCH from its login index (a member's row of each
conversation in the hour of its last activity) and the rest by the two reads; SQLite with
one statement; memory by a walk. The history spreads its activity over a day of hours, so
the index has many hours to read from; it moves conversations between hours again and
again, a user leaves one conversation (it is gone from the list) and joins another late,
and the log is applied in several units of work, then partly again (at-least-once
delivery). Every list size gives the same frames on every backend, and on Cassandra the
first frame really came from the index, reading fewer heads than the user has
conversations."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.cassandra.schema import TABLES, create_schema
from adapters.cassandra.session_heads import session_head_shard
from adapters.cassandra.session_states import session_cell, session_of_cell, vouched
from adapters.cassandra.views import CassandraViews
from adapters.cassandra.writer import SESSION_STATE_COLUMNS, session_state
from adapters.memory import MemoryViews
from fanout.bootstrap import open_views
from fanout.clock import FakeClock
from fanout.queries import Queries
from projections.ports import ViewStore
from projections.state import ACTIVITY_BUCKET, SessionHead, SessionState
from tests.contract.test_projection_replay import PARAMS
from tests.contract.test_projection_replay import apply as apply_unit
from tests.contract.test_projection_replay import build_log as replay_log
from tests.contract.test_view_store import CassandraKeyspace
from tests.integration.conftest import Harness
from tests.integration.test_invariants_stateful import PARAMS as GAP_PARAMS

T = "acme"
USER = "u"
CONVERSATIONS = 40
# (the first frame's sessions, the other frames' sessions)
FRAMINGS = ((1, 1), (3, 3), (2, 7), (7, 40), (40, 3), (100, 100), (5, 500))


def build_log(data_dir: Path) -> list[tuple[int, Any]]:
    clock = FakeClock()
    rng = random.Random(20261204)
    h = Harness(data_dir, PARAMS, clock)
    try:
        app = h.app
        for i in range(CONVERSATIONS):
            members = [USER, f"m{i}", "v"] if i != CONVERSATIONS - 1 else [f"m{i}", "v"]
            app.create_conversation(T, f"c{i:02d}", f"c{i}", members)
        for _ in range(160):
            clock.advance(rng.choice((5.0, 60.0, ACTIVITY_BUCKET / 3, ACTIVITY_BUCKET * 1.5)))
            i = rng.randrange(CONVERSATIONS)
            app.send_message(T, f"c{i:02d}", sender="v", text=f"at {clock.now:.0f}", mentions=[USER])
            if _ == 60:
                app.remove_member(T, "c05", USER)  # gone from u's list; its later activity must not bring it back
            if _ == 90:
                app.add_members(T, f"c{CONVERSATIONS - 1:02d}", [USER])  # joined late, in an old hour
            if _ == 120:
                app.mark_read(T, "c07", USER, 1)
        notes = app.recorder.select_notifications(start=0, limit=100_000)
        return [(n.id, app.mapper.to_domain_event(n)) for n in notes]
    finally:
        h.close()


def build_gap_log(data_dir: Path) -> list[tuple[int, Any]]:
    """A conversation that nobody is active in enters mention_only (gaps open for the silent
    members), gets a mention, a reply, a REBUILD, then a rollback, a send, a MARK_READ and a
    leave (test_invariants_examples' story, as a log)."""
    clock = FakeClock()
    h = Harness(data_dir, GAP_PARAMS, clock)
    try:
        app = h.app
        app.create_conversation(T, "q", "", ["a", "b", "d"])
        h.settle()
        rid = app.open_review(T, "small", "manual", {}, "admin")["review_id"]
        app.decide_review(T, rid, "enable_mention_only", "admin", 1.5, 0.5)
        h.settle()
        for kw in ({}, {"mentions": ["b"]}, {}, {"reply_to_seq": 1}):
            clock.advance(3.0)
            app.send_message(T, "q", sender="a", text="x", **kw)
            h.settle()
        app.request_rebuild(T, "q", "d")
        app.roll_back_tier(T, "small", "admin", "test")
        h.settle()
        clock.advance(3.0)
        app.send_message(T, "q", sender="a", text="y")
        app.mark_read(T, "q", "b", 5)
        app.remove_member(T, "q", "d")
        h.settle()
        notes = app.recorder.select_notifications(start=0, limit=10_000)
        return [(n.id, app.mapper.to_domain_event(n)) for n in notes]
    finally:
        h.close()


def apply(views: ViewStore, events: list[tuple[int, Any]], unit: int = 23) -> None:
    """In units of `unit` events, with freshly built projections each (a restarted host)."""
    for start in range(0, len(events), unit):
        apply_unit(views, events[start : start + unit])


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, Any]]:
    return build_log(tmp_path_factory.mktemp("login-log"))


@pytest.fixture(scope="module")
def cassandra(engines: dict[str, str]) -> Iterator[CassandraKeyspace]:
    ks = CassandraKeyspace(engines["FANOUT_VIEWS"])
    yield ks
    ks.close()


def frames(views: ViewStore, framing: tuple[int, int]) -> list[list[dict[str, Any]]]:
    first, size = framing
    q = Queries(views, PARAMS)
    return [f["sessions"] for f in q.session_batches(T, USER, size, first=first)]


def _not_yet(*args: Any) -> Any:
    raise AssertionError("the whole list was read before the first frame went out")


def test_the_login_of_one_history_is_the_same_on_every_backend(
    log: list[tuple[int, Any]], cassandra: CassandraKeyspace, tmp_path: Path
) -> None:
    memory = MemoryViews()
    sqlite = open_views(tmp_path / "sqlite", PARAMS.mailbox_shards)
    cql = cassandra.views()
    try:
        for views in (memory, sqlite, cql):
            apply(views, log)
        apply(cql, log[len(log) // 3 :], unit=11)  # at-least-once: a redelivered suffix changes nothing
        reference = {framing: frames(memory, framing) for framing in FRAMINGS}
        everyone = [s["conversation_id"] for f in reference[100, 100] for s in f]
        assert len(everyone) == CONVERSATIONS - 1  # every conversation but the one u left
        assert "c05" not in everyone and f"c{CONVERSATIONS - 1:02d}" in everyone
        for framing in FRAMINGS:
            assert frames(sqlite, framing) == reference[framing], f"sqlite, lists of {framing}"
            assert frames(cql, framing) == reference[framing], f"cassandra, lists of {framing}"
            assert [s for f in reference[framing] for s in f] == [s for f in reference[100, 100] for s in f]
        # the first list came from the index: a few hours' rows, not every head
        assert isinstance(cql, CassandraViews)
        quick = cql.first_sessions(T, USER, 3)
        assert quick is not None
        first, complete = quick
        assert not complete
        assert 3 <= len(first) < CONVERSATIONS - 1, len(first)
        # the first frame goes out before the rest of the list (every state, every head) is read
        q = Queries(cql, PARAMS)
        real_sessions = cql.sessions
        cql.sessions = _not_yet  # type: ignore[method-assign]
        try:
            frame = next(q.session_batches(T, USER, 3, first=3))
        finally:
            cql.sessions = real_sessions  # type: ignore[method-assign]
        assert frame["sessions"] == reference[3, 3][0] and frame["last"] is False
        # one live row per conversation of the user's, in the hour of its last activity
        rows = list(
            cql.session.execute(
                f"SELECT bucket, conversation_id FROM {cql.keyspace}.login_index WHERE tenant=%s AND user_id=%s",
                (T, USER),
            )
        )
        assert sorted(r["conversation_id"] for r in rows) == sorted(everyone)
        for r in rows:
            head = cql.head(T, r["conversation_id"])
            assert head is not None and r["bucket"] == int(head["last_activity_at"] // ACTIVITY_BUCKET)
    finally:
        sqlite.close()
        cql.close()


def test_the_session_heads_copy_answers_a_login_and_heads_fill_what_it_lacks(
    log: list[tuple[int, Any]], cassandra: CassandraKeyspace
) -> None:
    """ADR-0042: the copy holds every head's session columns in its shard's partition, with
    the head's stamp; a login reads the copy (shown by a copy row changed behind its back)
    and reads from `heads` what the copy lacks (rows deleted: a unit between its heads and
    its copy, a keyspace written before the copy); the items are the memory backend's."""
    memory = MemoryViews()
    cql = cassandra.views()
    try:
        apply(memory, log)
        apply(cql, log)
        reference = {framing: frames(memory, framing) for framing in FRAMINGS}
        ks = cql.keyspace
        # the copy: one row per head, in its shard, the head's session columns and stamp
        columns = f"conversation_id, {', '.join(SessionHead._fields[1:])}, writetime(write_policy) AS ts"

        def by_conversation(select: str, table: str) -> dict[str, dict[str, Any]]:
            rows = cql.session.execute(f"SELECT {select} FROM {ks}.{table} WHERE tenant=%s ALLOW FILTERING", (T,))
            return {r["conversation_id"]: r for r in rows}

        heads = by_conversation(columns, "heads")
        copy = by_conversation(f"shard, {columns}", "session_heads")
        assert len(heads) == CONVERSATIONS and copy.keys() == heads.keys()
        for cid, row in copy.items():
            assert row.pop("shard") == session_head_shard(cid)
            assert row == heads[cid], cid

        cql.copy_read_from = 1  # every login's heads from the copy
        for framing in FRAMINGS:
            assert frames(cql, framing) == reference[framing], f"from the copy, lists of {framing}"
        # the copy is what was read: a row changed behind the views' back shows
        victim = reference[100, 100][0][5]["conversation_id"]
        cql.session.execute(
            f"UPDATE {ks}.session_heads USING TIMESTAMP %s SET preview='changed' "
            "WHERE tenant=%s AND shard=%s AND conversation_id=%s",
            (copy[victim]["ts"] + 1, T, session_head_shard(victim), victim),
        )
        shown = {s["conversation_id"]: s["preview"] for f in frames(cql, (100, 100)) for s in f}
        assert shown[victim] == "changed"
        cql.copy_read_from = 10**9  # below the threshold: every head from `heads`
        assert frames(cql, (100, 100)) == reference[100, 100]
        # rows the copy lacks are read from heads
        cql.copy_read_from = 1
        gone = [s["conversation_id"] for s in reference[100, 100][0][::3]]
        for cid in [*gone, victim]:
            cql.session.execute(
                f"DELETE FROM {ks}.session_heads USING TIMESTAMP %s WHERE tenant=%s AND shard=%s AND conversation_id=%s",
                (copy[cid]["ts"] + 2, T, session_head_shard(cid), cid),
            )
        for framing in FRAMINGS:
            assert frames(cql, framing) == reference[framing], f"copy lacking {len(gone) + 1}, lists of {framing}"
    finally:
        cql.close()


def copy_mirrors_user_states(cql: CassandraViews) -> list[SessionState]:
    """ADR-0043: the states' copy has a row exactly where user_states has one, its cell the
    SessionState of that row's columns, written with the row's latest stamp. Returns the
    states, for the caller to see what the history exercised."""
    ks, cols = cql.keyspace, ", ".join(SESSION_STATE_COLUMNS)
    rows = {
        (r["tenant"], r["user_id"], r["conversation_id"]): r
        for r in cql.session.execute(
            f"SELECT tenant, user_id, conversation_id, {cols}, writetime(read_conversation_seq) AS w_put, "
            f"writetime(delivered_conversation_seq) AS w_gap FROM {ks}.user_states"
        )
    }
    copy = {
        (r["tenant"], r["user_id"], r["conversation_id"]): r
        for r in cql.session.execute(
            f"SELECT tenant, user_id, conversation_id, state, writetime(state) AS w FROM {ks}.session_states"
        )
    }
    assert copy.keys() == rows.keys()
    out = []
    for key, row in rows.items():
        state = session_state(tuple(row[c] for c in SESSION_STATE_COLUMNS))
        assert session_of_cell(copy[key]["state"]) == state, key
        assert copy[key]["w"] == max(row["w_put"], row["w_gap"]), key
        out.append(state)
    return out


def test_the_states_copy_mirrors_user_states_through_puts_gaps_and_leaves(
    cassandra: CassandraKeyspace, tmp_path: Path
) -> None:
    """The replay contract's history (mentions, broadcasts, a leave, MARK_READ, REBUILD), then
    a conversation's in mention_only (gaps opened and closed, build_gap_log), one event a unit:
    after each, the copy mirrors user_states row for row; then again at-least-once (its
    crash splits: test_projection_replay)."""
    history = [*replay_log(tmp_path / "log"), *((n + 1000, e) for n, e in build_gap_log(tmp_path / "gaps"))]
    cql = cassandra.views()
    try:
        seen: list[SessionState] = []
        for i in range(len(history)):
            apply(cql, history[i : i + 1])
            seen.extend(copy_mirrors_user_states(cql))
        assert seen and any(s.skipping or s.delivered_conversation_seq is not None for s in seen), "no gap"
        assert any(s.personal_mentions for s in seen) and any(s.broadcast_base for s in seen)
        apply(cql, history[len(history) // 2 :], unit=3)
        copy_mirrors_user_states(cql)
    finally:
        cql.close()


def test_a_login_reads_the_states_copy_only_where_it_is_vouched_complete(
    log: list[tuple[int, Any]], cassandra: CassandraKeyspace
) -> None:
    """ADR-0043: a vouched copy answers the login alone (a cell changed behind the views'
    back shows); without the mark the login reads user_states and equals the memory
    backend's; the schema vouches for the copy beside an empty user_states only, never
    beside rows written before the copy existed."""
    memory = MemoryViews()
    cql = cassandra.views()
    try:
        apply(memory, log)
        apply(cql, log)
        copy_mirrors_user_states(cql)
        reference = {framing: frames(memory, framing) for framing in FRAMINGS}
        assert cql.states_copy_vouched()
        for framing in FRAMINGS:
            assert frames(cql, framing) == reference[framing], f"from the copy, lists of {framing}"
        ks = cql.keyspace
        victim = reference[100, 100][0][4]["conversation_id"]
        state = session_of_cell(
            cql.session.execute(
                f"SELECT state FROM {ks}.session_states WHERE tenant=%s AND user_id=%s AND conversation_id=%s",
                (T, USER, victim),
            ).one()["state"]
        )
        cql.session.execute(
            f"UPDATE {ks}.session_states USING TIMESTAMP %s SET state=%s "
            "WHERE tenant=%s AND user_id=%s AND conversation_id=%s",
            (2**62, session_cell(state._replace(personal_mentions=state.personal_mentions + 77)), T, USER, victim),
        )
        shown = {s["conversation_id"]: s for f in frames(cql, (100, 100)) for s in f}
        want = {s["conversation_id"]: s for f in reference[100, 100] for s in f}
        assert shown[victim]["mention_count"] == want[victim]["mention_count"] + 77
        # not vouched: user_states answers, as before the copy
        cql.session.execute(f"TRUNCATE {ks}.copies_complete")
        unvouched = CassandraViews(cql.session, ks, cql.mailbox)
        assert not unvouched.states_copy_vouched()
        for framing in FRAMINGS:
            assert frames(unvouched, framing) == reference[framing], f"not vouched, lists of {framing}"
        # the schema vouches beside an empty user_states only
        s = cassandra.settings
        create_schema(cql.session, ks, s.replication, s.datacenter, TABLES)
        assert not vouched(cql.session, ks)
        cql.session.execute(f"TRUNCATE {ks}.user_states")
        create_schema(cql.session, ks, s.replication, s.datacenter, TABLES)
        assert vouched(cql.session, ks)
    finally:
        cql.close()
