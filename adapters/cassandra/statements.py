"""The views' prepared CQL (adapters/cassandra/views.py), as mailbox.py's `Statements` is the
mailbox's: every write of a unit of work's rounds and every read of the ReadSide port, by
name, prepared once on the views' session.

Every write from the log carries `USING TIMESTAMP ?`: its log position's stamp (stamps.py),
so a stale writer's rows lose to a newer one's (ADR-0021). The few that are not from the log
say so. The rows bound to the writes are built in writer.py; the tables are schema.py's."""

from __future__ import annotations

from typing import NamedTuple

from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from adapters.cassandra.mailbox_floors import SELECT as SELECT_FLOOR
from adapters.cassandra.mailbox_floors import UPDATE as UPDATE_FLOOR
from adapters.cassandra.writer import SESSION_STATE_COLUMNS
from projections.rows import DELIVERY_RECORD, HEAD_COLUMNS, MESSAGE_COLUMNS, STATE_COLUMNS
from projections.state import SessionHead


class ViewStatements(NamedTuple):
    """The views' statements by name: `writes` (the rows of a commit, writer.py binds them)
    and `reads`."""

    writes: dict[str, PreparedStatement]
    reads: dict[str, PreparedStatement]

    @classmethod
    def prepare(cls, session: Session, keyspace: str) -> ViewStatements:
        return cls(_writes(session, keyspace), _reads(session, keyspace))


def _writes(session: Session, ks: str) -> dict[str, PreparedStatement]:
    p = session.prepare
    state_cols = ", ".join(STATE_COLUMNS)
    state_marks = ", ".join("?" * len(STATE_COLUMNS))
    ts = "USING TIMESTAMP ?"  # every write of a unit: its log position's stamp (stamps.py)
    return {
        "track": p(f"INSERT INTO {ks}.tracking (projection, partition, position) VALUES (?, ?, ?) {ts}"),
        "floor": p(UPDATE_FLOOR.format(ks=ks)),  # written with a user's state row (ADR-0045)
        "log_position": p(f"INSERT INTO {ks}.log_positions (partition, position, next_offset) VALUES (?, ?, ?) {ts}"),
        "head": p(
            f"INSERT INTO {ks}.heads (tenant, conversation_id, {', '.join(HEAD_COLUMNS)}) "
            f"VALUES (?, ?, {', '.join('?' * len(HEAD_COLUMNS))}) {ts}"
        ),
        "session_head": p(
            f"INSERT INTO {ks}.session_heads (tenant, shard, {', '.join(SessionHead._fields)}) "
            f"VALUES (?, ?, {', '.join('?' * len(SessionHead._fields))}) {ts}"
        ),
        "by_aggregate": p(
            f"INSERT INTO {ks}.heads_by_aggregate (aggregate_id, tenant, conversation_id) VALUES (?, ?, ?) {ts}"
        ),
        "by_tenant": p(
            f"INSERT INTO {ks}.heads_by_tenant (tenant, conversation_id, size_bucket) VALUES (?, ?, ?) {ts}"
        ),
        "message": p(
            f"INSERT INTO {ks}.messages (tenant, {', '.join(MESSAGE_COLUMNS)}) "
            f"VALUES (?, {', '.join('?' * len(MESSAGE_COLUMNS))}) {ts}"
        ),
        "broadcast": p(
            f"INSERT INTO {ks}.broadcasts (tenant, conversation_id, conversation_seq) VALUES (?, ?, ?) {ts}"
        ),
        "delivery": p(
            f"INSERT INTO {ks}.delivery (tenant, conversation_id, conversation_seq, {', '.join(DELIVERY_RECORD)}, "
            f"materialized_at) VALUES (?, ?, ?, {', '.join('?' * len(DELIVERY_RECORD))}, ?) {ts}"
        ),
        "conv_state": p(
            f"INSERT INTO {ks}.conversation_states (tenant, conversation_id, user_id, {state_cols}) "
            f"VALUES (?, ?, ?, {state_marks}) {ts}"
        ),
        "user_state": p(
            f"INSERT INTO {ks}.user_states (tenant, user_id, conversation_id, {state_cols}) "
            f"VALUES (?, ?, ?, {state_marks}) {ts}"
        ),
        "conv_gap": p(
            f"UPDATE {ks}.conversation_states {ts} SET delivered_conversation_seq=?, skipping=?, gap_end=? "
            "WHERE tenant=? AND conversation_id=? AND user_id=?"
        ),
        "user_gap": p(
            f"UPDATE {ks}.user_states {ts} SET delivered_conversation_seq=?, skipping=?, gap_end=? "
            "WHERE tenant=? AND user_id=? AND conversation_id=?"
        ),
        "conv_delete": p(
            f"DELETE FROM {ks}.conversation_states {ts} WHERE tenant=? AND conversation_id=? AND user_id=?"
        ),
        "user_delete": p(f"DELETE FROM {ks}.user_states {ts} WHERE tenant=? AND user_id=? AND conversation_id=?"),
        # the login's copy of user_states (ADR-0043), written with it (writer.py rows)
        "session_state": p(
            f"INSERT INTO {ks}.session_states (tenant, user_id, conversation_id, state) VALUES (?, ?, ?, ?) {ts}"
        ),
        "session_state_gap": p(
            f"UPDATE {ks}.session_states {ts} SET state=? WHERE tenant=? AND user_id=? AND conversation_id=?"
        ),
        "session_state_delete": p(
            f"DELETE FROM {ks}.session_states {ts} WHERE tenant=? AND user_id=? AND conversation_id=?"
        ),
        "index": p(f"INSERT INTO {ks}.login_index (tenant, user_id, bucket, conversation_id) VALUES (?, ?, ?, ?) {ts}"),
        "unindex": p(
            f"DELETE FROM {ks}.login_index {ts} WHERE tenant=? AND user_id=? AND bucket=? AND conversation_id=?"
        ),
        "review": p(f"INSERT INTO {ks}.reviews (review_id, tenant, body, written) VALUES (?, ?, ?, ?) {ts}"),
        "review_by_tenant": p(
            f"INSERT INTO {ks}.reviews_by_tenant (tenant, review_id, body, written) VALUES (?, ?, ?, ?) {ts}"
        ),
        "tier": p(f"UPDATE {ks}.tiers {ts} SET body = body + ? WHERE tier_id = ?"),
        "capacity": p(f"INSERT INTO {ks}.capacity (projection, body) VALUES (?, ?) {ts}"),
        # not from the log (no fencing stamp): a replica's count, a monitor's compare-and-set
        "pushes": p(
            f"INSERT INTO {ks}.delivery_pushes (tenant, conversation_id, conversation_seq, pusher, pushes) "
            "VALUES (?, ?, ?, ?, ?)"
        ),
        "capacity_create": p(f"INSERT INTO {ks}.capacity (projection, body) VALUES (?, ?) IF NOT EXISTS"),
        "capacity_swap": p(f"UPDATE {ks}.capacity SET body=? WHERE projection=? IF body=?"),
    }


def _reads(session: Session, ks: str) -> dict[str, PreparedStatement]:
    p = session.prepare
    return {
        "position": p(f"SELECT position FROM {ks}.tracking WHERE projection=? AND partition=?"),
        "projection": p(f"SELECT partition, position FROM {ks}.tracking WHERE projection=?"),
        "head": p(f"SELECT * FROM {ks}.heads WHERE tenant=? AND conversation_id=?"),
        "heads_in": p(
            f"SELECT {', '.join(SessionHead._fields)} FROM {ks}.heads WHERE tenant=? AND conversation_id IN ?"
        ),
        "session_heads_in": p(
            f"SELECT {', '.join(SessionHead._fields)} FROM {ks}.session_heads "
            "WHERE tenant=? AND shard=? AND conversation_id IN ?"
        ),
        "by_aggregate": p(f"SELECT tenant, conversation_id FROM {ks}.heads_by_aggregate WHERE aggregate_id=?"),
        "by_tenant": p(f"SELECT conversation_id, size_bucket FROM {ks}.heads_by_tenant WHERE tenant=?"),
        "conv_states": p(f"SELECT * FROM {ks}.conversation_states WHERE tenant=? AND conversation_id=?"),
        "last_active": p(f"SELECT last_active FROM {ks}.conversation_states WHERE tenant=? AND conversation_id=?"),
        "floor": p(SELECT_FLOOR.format(ks=ks)),
        "broadcasts": p(f"SELECT conversation_seq FROM {ks}.broadcasts WHERE tenant=? AND conversation_id=?"),
        "state": p(f"SELECT * FROM {ks}.user_states WHERE tenant=? AND user_id=? AND conversation_id=?"),
        "user_states": p(f"SELECT * FROM {ks}.user_states WHERE tenant=? AND user_id=?"),
        "session_states": p(
            f"SELECT conversation_id, {', '.join(SESSION_STATE_COLUMNS)} FROM {ks}.user_states "
            "WHERE tenant=? AND user_id=?"
        ),
        "session_states_in": p(
            f"SELECT conversation_id, {', '.join(SESSION_STATE_COLUMNS)} FROM {ks}.user_states "
            "WHERE tenant=? AND user_id=? AND conversation_id IN ?"
        ),
        "states_copy": p(f"SELECT conversation_id, state FROM {ks}.session_states WHERE tenant=? AND user_id=?"),
        "states_copy_in": p(
            f"SELECT conversation_id, state FROM {ks}.session_states "
            "WHERE tenant=? AND user_id=? AND conversation_id IN ?"
        ),
        "login_index": p(f"SELECT bucket, conversation_id FROM {ks}.login_index WHERE tenant=? AND user_id=?"),
        "message": p(f"SELECT * FROM {ks}.messages WHERE tenant=? AND conversation_id=? AND conversation_seq=?"),
        "messages": p(
            f"SELECT * FROM {ks}.messages WHERE tenant=? AND conversation_id=? AND conversation_seq>? LIMIT ?"
        ),
        "delivery": p(f"SELECT * FROM {ks}.delivery WHERE tenant=? AND conversation_id=? AND conversation_seq=?"),
        "review": p(f"SELECT body FROM {ks}.reviews WHERE review_id=?"),
        "reviews": p(f"SELECT body, written FROM {ks}.reviews_by_tenant WHERE tenant=?"),
        "tier": p(f"SELECT body FROM {ks}.tiers WHERE tier_id=?"),
        "capacity": p(f"SELECT body FROM {ks}.capacity WHERE projection=?"),
        "pushes": p(
            f"SELECT pushes FROM {ks}.delivery_pushes WHERE tenant=? AND conversation_id=? AND conversation_seq=?"
        ),
        "log_position": p(f"SELECT position, next_offset FROM {ks}.log_positions WHERE partition=?"),
    }
