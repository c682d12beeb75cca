"""Cassandra backend of the mailbox (UserMailboxEntry), the O(N) write of a message.

One table, partition (tenant, user_id), clustering pos: a user's inbox query is one
partition read. A message to N members is written as UNLOGGED batches of BATCH_ROWS
rows (consecutive members of a MailboxShard list) with up to IN_FLIGHT batches in the
air, never one round trip per member. Every row is an upsert of the same key (tenant,
user, pos) with the same values and the same write timestamp (the message's log position,
adapters/cassandra/stamps.py), so writing the same refs again changes nothing.
docs/adr/0014-cassandra-data-model.md."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from adapters.cassandra.connect import ClusterSettings, Connection, open_session, run
from adapters.cassandra.schema import MAILBOX_TABLE
from adapters.cassandra.stamps import stamp
from projections.ports import MailboxEntry, MessageRefs

BATCH_ROWS = 100  # rows per UNLOGGED batch (100 x ~60 bytes: far below the 64 KiB size warning)
IN_FLIGHT = 200  # batches in the air at once
INSERT_ENTRY = (
    "INSERT INTO {ks}.mailbox (tenant, user_id, pos, conversation_seq, conversation_id, flags) "
    "VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"  # the message's log position (stamps.py)
)


_BIGINT = struct.Struct(">q")
_INT = struct.Struct(">i")


class EncodedRow(NamedTuple):
    """A row of a prepared statement with its values already serialized as the protocol
    carries them (text: UTF-8, bigint: 8 bytes big-endian, int: 4 bytes)."""

    query_id: bytes
    values: list[bytes]
    key: tuple[bytes, ...]  # the serialized partition key columns (token-aware routing)


Row = tuple[PreparedStatement, tuple[Any, ...]] | EncodedRow


def routing_key(key: tuple[bytes, ...]) -> bytes:
    """The routing key of a partition key (the driver's encoding of a composite key)."""
    if len(key) == 1:
        return key[0]
    return b"".join(struct.pack(">H", len(c)) + c + b"\x00" for c in key)


def grouped(rows: Iterable[Row], size: int, keyspace: str) -> Iterator[tuple[BatchStatement, None]]:
    """UNLOGGED batches of `size` rows (grouped writes, not one round trip each); a batch is
    routed by its first row. An EncodedRow is appended as it is: the driver's batch keeps
    (prepared?, query id, serialized values) per statement (cassandra/query.py
    BatchStatement._add_statement_and_params, which BatchStatement.add calls after binding)."""
    batch, n = BatchStatement(batch_type=BatchType.UNLOGGED), 0
    for row in rows:
        if isinstance(row, EncodedRow):
            if n == 0:
                batch.routing_key, batch.keyspace = routing_key(row.key), keyspace
            batch._add_statement_and_params(True, row.query_id, row.values)
        else:
            batch.add(*row)
        n += 1
        if n == size:
            yield batch, None
            batch, n = BatchStatement(batch_type=BatchType.UNLOGGED), 0
    if n:
        yield batch, None


class CassandraMailbox:
    """A MailboxStore on Cassandra. Give it a session (shared with the views: close() then
    leaves the Cluster to its owner) or open one with `from_settings` / `connect`."""

    def __init__(self, session: Session, keyspace: str, *, connection: Connection | None = None) -> None:
        """`connection`: the session's Connection when this store owns it (close() closes it)."""
        self.session = session
        self.keyspace = keyspace
        self._connection = connection
        ks = keyspace
        self._insert: PreparedStatement = session.prepare(INSERT_ENTRY.format(ks=ks))
        self._read: PreparedStatement = session.prepare(
            f"SELECT pos, conversation_seq, conversation_id, flags FROM {ks}.mailbox "
            "WHERE tenant=? AND user_id=? AND pos>? AND pos<=? LIMIT ?"
        )

    @classmethod
    def connect(
        cls,
        hosts: Iterable[str],
        port: int,
        keyspace: str,
        *,
        replication: int = 1,
        consistency: str = "LOCAL_ONE",
        datacenter: str = "datacenter1",
        reactor: str = "libev",
    ) -> CassandraMailbox:
        """A mailbox on a session of its own (the keyspace and the table created if absent)."""
        settings = ClusterSettings(tuple(hosts), port, keyspace, replication, consistency, datacenter)
        return cls.from_settings(settings, reactor=reactor)

    @classmethod
    def from_settings(cls, settings: Any, *, reactor: str = "libev") -> CassandraMailbox:
        """A mailbox on a session of its own (connect.open_session: the keyspace and the table
        created if absent), which it owns; `settings`: fanout.urls.CassandraSettings."""
        connection = open_session(settings, tables=(MAILBOX_TABLE,), reactor=reactor)
        try:
            return cls(connection.session, settings.keyspace, connection=connection)
        except BaseException:
            connection.close()
            raise

    # -- writing -------------------------------------------------------------------

    def rows(self, tenant: str, refs: MessageRefs, insert: PreparedStatement | None = None) -> Iterator[EncodedRow]:
        """The insert of each entry, its values serialized here (6.2 -> 0.2 us a row of client
        CPU against BatchStatement.add binding each one; measured, ADR-0025): consecutive
        members of each shard list. The views' unit of work packs them into its first round
        with the other member-keyed rows, with `insert` (INSERT_ENTRY prepared on its session)."""
        query_id = (insert or self._insert).query_id
        t, cid = tenant.encode(), refs.conversation_id.encode()
        pos, seq, ts = _BIGINT.pack(refs.pos), _BIGINT.pack(refs.seq), _BIGINT.pack(stamp(refs.pos))
        flag_cells = {refs.flags: _INT.pack(refs.flags)}
        special, plain = refs.special, flag_cells[refs.flags]
        for shard in sorted(refs.shards):
            for u in refs.shards[shard]:
                user = u.encode()
                if u in special:
                    f = special[u]
                    cell = flag_cells.get(f) or flag_cells.setdefault(f, _INT.pack(f))
                else:
                    cell = plain
                yield EncodedRow(query_id, [t, user, pos, seq, cid, cell, ts], (t, user))

    def batches(self, tenant: str, refs: MessageRefs) -> Iterator[BatchStatement]:
        """UNLOGGED batches of BATCH_ROWS rows, packed across shard lists."""
        for batch, _ in grouped(self.rows(tenant, refs), BATCH_ROWS, self.keyspace):
            yield batch

    def write(self, tenant: str, refs: MessageRefs) -> int:
        run(self.session, ((b, None) for b in self.batches(tenant, refs)), IN_FLIGHT)
        return sum(len(users) for users in refs.shards.values())

    # -- reading -------------------------------------------------------------------

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        if limit <= 0 or until <= after:
            return []
        rows = self.session.execute(self._read, (tenant, user_id, after, until, limit))
        return [(user_id, r["pos"], r["conversation_seq"], r["conversation_id"], r["flags"]) for r in rows]

    def count(self) -> int:
        """A scan of the table (tools and tests)."""
        row = self.session.execute(f"SELECT count(*) AS n FROM {self.keyspace}.mailbox", timeout=300).one()
        return int(row["n"])

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        """A scan of the table, sorted here (the table is in token order)."""
        rows = self.session.execute(
            f"SELECT tenant, user_id, pos, conversation_seq, conversation_id, flags FROM {self.keyspace}.mailbox",
            timeout=300,
        )
        yield from sorted(
            (r["tenant"], r["user_id"], r["pos"], r["conversation_seq"], r["conversation_id"], r["flags"]) for r in rows
        )

    def sort_key(self, tenant: str, user_id: str, pos: int) -> tuple[str, str, int]:
        return (tenant, user_id, pos)

    def flush(self) -> None:
        pass  # a write returns once the consistency level acknowledged every batch (commit log)

    def reopen(self) -> None:
        pass  # the driver reconnects by itself; the projector's retry writes the same upserts

    def close(self) -> None:
        """Close the Connection if this store owns it (a borrowed session stays open); closing again is harmless."""
        if self._connection is not None:
            self._connection.close()
