"""The login's reads on Cassandra (ADR-0028, ADR-0042, ADR-0043): a user's session list
as the two reads (the user's states, then the heads of those conversations), the first
list from the login index, and the copies that make them cheap: the session heads' copy of
the heads (session_heads.py) and the states' copy, a cell a row (session_states.py), each
read only where it is vouched complete. `CassandraViews` (views.py) is a LoginReads: these
reads share its session, its prepared statements (statements.py) and the replica's head
cache (ADR-0035)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement

from adapters.cassandra.connect import TUPLE_ROWS
from adapters.cassandra.session_heads import session_head_shard
from adapters.cassandra.session_states import COPY as STATES_COPY
from adapters.cassandra.session_states import session_of_cell, vouched
from adapters.cassandra.writer import session_state
from projections.head_cache import HeadCache
from projections.state import SessionHead, SessionItem, SessionState

IN_FLIGHT = 200  # read requests of one login in the air at once
HEADS_PER_READ = 100  # conversation heads read by one request of the login's batched read
# A login's heads read from the session heads' copy (ADR-0042) when at least this many, and this
# many of one partition to a request (docs/PERFORMANCE.md section 22)
COPY_READ_FROM = 500
COPY_PER_READ = 100
# rows of the user's states partition per page of the login's read (one page for most users)
SESSION_STATES_PAGE = 10_000
COPY_RECHECK = 30.0  # seconds between asking whether the states' copy is vouched, until it is


class LoginReads:
    """The login's reads over a session whose keyspace has the views' tables, with the
    views' read statements (statements.py `ViewStatements.reads`)."""

    def __init__(
        self,
        session: Session,
        keyspace: str,
        reads: dict[str, PreparedStatement],
        head_cache: HeadCache | None = None,
    ) -> None:
        self.session = session
        self.keyspace = keyspace
        self._r = reads
        # An API replica's cache of the heads its logins read (ADR-0035), fed by the workers'
        # commit records; None elsewhere (workers, tools): every head is read.
        self.head_cache = head_cache
        self.copy_read_from = COPY_READ_FROM  # a login's heads from the session heads' copy from this many
        self.read_states_copy = True  # False: a login reads user_states even where the copy is vouched (benches)
        # copy -> vouched complete (ADR-0043's states copy, ADR-0045's mailbox floors), and when asked
        self._vouched: dict[str, bool] = {}
        self._vouched_asked: dict[str, float] = {}

    def heads(self, tenant: str, conversation_ids: Sequence[str], batch: int) -> Iterator[list[SessionHead]]:
        """The heads of a login, most recent activity first, `batch` to a list: those the
        replica's cache holds (ADR-0035), the rest read (`_read_heads`) and cached."""
        ids = list(dict.fromkeys(conversation_ids))
        cache = self.head_cache
        rows: list[SessionHead] = []
        if cache is not None:
            cached, ticket = cache.get_many(tenant, ids)
            if cached:
                rows.extend(cached.values())
                ids = [c for c in ids if c not in cached]
        read = self._read_heads(tenant, ids)
        if cache is not None and read:
            cache.fill(ticket, tenant, read)
        rows.extend(read)
        rows.sort(key=lambda h: (-(h.last_activity_at or 0.0), h.conversation_id))
        for i in range(0, len(rows), batch):
            yield rows[i : i + batch]

    def _read_heads(self, tenant: str, ids: list[str]) -> list[SessionHead]:
        """Many heads from the session heads' copy (ADR-0042): at most SESSION_HEAD_SHARDS
        partitions, `IN` on their clustering key, the requests concurrent (Cassandra's CPU a
        head ~4x less than a partition each). The ones it lacks (a unit of work between its
        heads and its copy, a keyspace written before the copy) are read from `heads`,
        HEADS_PER_READ partitions a request (`IN` on the partition key's last column), as are
        all of them when fewer than `copy_read_from` (COPY_READ_FROM): one request then costs less than one
        per shard."""
        read: list[SessionHead] = []
        if len(ids) >= self.copy_read_from:
            by_shard: dict[int, list[str]] = {}
            for c in ids:
                by_shard.setdefault(session_head_shard(c), []).append(c)
            read = self._read_concurrently(
                self._r["session_heads_in"],
                [
                    (tenant, shard, part[i : i + COPY_PER_READ])
                    for shard, part in by_shard.items()
                    for i in range(0, len(part), COPY_PER_READ)
                ],
            )
            found = {h.conversation_id for h in read}
            ids = [c for c in ids if c not in found] if len(found) < len(ids) else []
        if ids:
            read.extend(
                self._read_concurrently(
                    self._r["heads_in"],
                    [(tenant, ids[i : i + HEADS_PER_READ]) for i in range(0, len(ids), HEADS_PER_READ)],
                )
            )
        return read

    def _read_concurrently(self, statement: PreparedStatement, args: list[tuple[Any, ...]]) -> list[SessionHead]:
        read: list[SessionHead] = []
        results = execute_concurrent_with_args(
            self.session, statement, args, concurrency=IN_FLIGHT, execution_profile=TUPLE_ROWS
        )
        for ok, result in results:
            if not ok:
                raise result
            read.extend(map(SessionHead._make, result))
        return read

    def sessions(self, tenant: str, user_id: str, batch: int) -> Iterator[list[SessionItem]]:
        """The two reads (projections/state.py sessions_by_two_reads), each row read as a
        tuple of only what a session item shows: the user's states partition, then the heads."""
        states = self.session_states(tenant, user_id)
        for heads in self.heads(tenant, list(states), batch):
            yield [(h, states[h.conversation_id]) for h in heads]

    def session_states(self, tenant: str, user_id: str) -> dict[str, SessionState]:
        """conversation id -> what the session list needs of the user's state in it (one
        partition, SESSION_STATES_PAGE rows a page): from the login's copy, a cell a row,
        where it is vouched complete (ADR-0043), else from user_states' columns."""
        copy = self.states_copy_vouched()
        statement = self._r["states_copy" if copy else "session_states"].bind((tenant, user_id))
        statement.fetch_size = SESSION_STATES_PAGE
        rows = self.session.execute(statement, execution_profile=TUPLE_ROWS)
        if copy:
            return {c: session_of_cell(cell) for c, cell in rows}
        return {r[0]: session_state(r[1:]) for r in rows}

    def states_copy_vouched(self) -> bool:
        """Whether the login reads the states' copy (ADR-0043, session_states.py `vouched`):
        once it is, for good; until then asked again at most every COPY_RECHECK seconds."""
        return self.read_states_copy and self._copy_vouched(STATES_COPY)

    def _copy_vouched(self, copy: str) -> bool:
        """Whether `copy` is vouched complete (session_states.py `vouched`): once it is, for
        good; until then asked again at most every COPY_RECHECK seconds."""
        if not self._vouched.get(copy, False):
            now = time.monotonic()
            asked = self._vouched_asked.get(copy)
            if asked is None or now - asked >= COPY_RECHECK:
                self._vouched_asked[copy] = now
                self._vouched[copy] = vouched(self.session, self.keyspace, copy)
        return self._vouched.get(copy, False)

    def first_sessions(self, tenant: str, user_id: str, batch: int) -> tuple[list[SessionItem], bool] | None:
        """The first list from the login index (ADR-0028): (the sessions of every
        conversation whose last activity is in the index hours read, most recent first;
        whether that is all of the user's), or None when the index has no row for the user or
        holds fewer live rows than a list needs although it has more hours (then it cannot
        vouch for the order). Exact: every member has a row in the hour of the
        conversation's last activity, so the conversations not read were last active
        before the oldest hour read, after all of those that were."""
        statement = self._r["login_index"].bind((tenant, user_id))
        statement.fetch_size = max(2 * batch, 100)
        candidates: dict[str, None] = {}
        last: int | None = None
        complete = True
        for row in self.session.execute(statement):
            if len(candidates) >= batch and row["bucket"] != last:
                complete = False
                break
            candidates[row["conversation_id"]] = None
            last = row["bucket"]
        if not candidates:  # no conversation, or views written before the index: the two reads say
            return None
        ids = list(candidates)
        copy = self.states_copy_vouched()
        states_f = [
            self.session.execute_async(
                self._r["states_copy_in" if copy else "session_states_in"],
                (tenant, user_id, ids[i : i + HEADS_PER_READ]),
                execution_profile=TUPLE_ROWS,
            )
            for i in range(0, len(ids), HEADS_PER_READ)
        ]
        heads = [h for part in self.heads(tenant, ids, len(ids)) for h in part]  # while the states come
        states: dict[str, SessionState] = {}
        for f in states_f:
            for r in f.result():
                states[r[0]] = session_of_cell(r[1]) if copy else session_state(r[1:])
        found = [(h, states[h.conversation_id]) for h in heads if h.conversation_id in states]
        if not complete and len(found) < batch:
            return None
        return found, complete
