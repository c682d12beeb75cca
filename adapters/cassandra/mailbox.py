"""Cassandra backend of the mailbox (UserMailboxEntry), the O(N) write of a message.

One table, partition (tenant, user_id), clustering pos: a user's inbox query is one
partition read. A message to N members is written as UNLOGGED batches of BATCH_ROWS
rows (consecutive members of a MailboxShard list) with up to IN_FLIGHT batches in the
air, never one round trip per member. Every row is an upsert of the same key (tenant,
user, pos) with the same values and the same write timestamp (the message's log position,
adapters/cassandra/stamps.py), so writing the same refs again changes nothing.
docs/adr/0014-cassandra-data-model.md."""

from __future__ import annotations

import logging
import struct
import uuid
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.concurrent import execute_concurrent
from cassandra.io.asyncioreactor import AsyncioConnection
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy
from cassandra.query import BatchStatement, BatchType, PreparedStatement, dict_factory

from adapters.cassandra.stamps import stamp
from projections.ports import MailboxEntry, MessageRefs

BATCH_ROWS = 100  # rows per UNLOGGED batch (100 x ~60 bytes: far below the 64 KiB size warning)
IN_FLIGHT = 200  # batches in the air at once
TIMEOUT = 30.0  # seconds per request
# The driver's default reconnection policy doubles its delay up to 600 s: after a Cassandra
# restart of ~16 s the next attempt came ~15 s after the node was back (the worker's retried
# unit and the replicas' watermark watcher waited for it; tests/distributed/test_crash.py).
RECONNECT_DELAYS = (0.5, 5.0)  # seconds: first delay, longest delay between attempts

MAILBOX_TABLE = """
CREATE TABLE IF NOT EXISTS {ks}.mailbox (
    tenant text, user_id text, pos bigint,
    conversation_seq bigint, conversation_id text, flags int,
    PRIMARY KEY ((tenant, user_id), pos)
) WITH CLUSTERING ORDER BY (pos ASC) AND ID = {id}"""

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


class _GroupedBatchWarnings(logging.Filter):
    """The driver logs every server warning; an UNLOGGED batch of members (one partition
    each) is warned about by design (unlogged_batch_across_partitions_warn_threshold):
    that one is dropped, one per batch would flood the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.args and "Unlogged batch covering" in str(record.args[0] if isinstance(record.args, tuple) else "")
        )


_protocol_log = logging.getLogger("cassandra.protocol")
if not any(isinstance(f, _GroupedBatchWarnings) for f in _protocol_log.filters):
    _protocol_log.addFilter(_GroupedBatchWarnings())


def table_id(keyspace: str, table: str) -> uuid.UUID:
    """A table id derived from its name: two processes creating the same table at once
    (CREATE ... IF NOT EXISTS on two coordinators) create the same table, not two."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"fanout/{keyspace}/{table}")


def _connection_class(reactor: str) -> Any:
    """libev (the default): the asyncio reactor let the process exit at once after
    shutdown() (libev's atexit joins its loop thread for up to 5 s), but it failed 3 of 4
    100k-member fan-outs with "CRC mismatch on header" (protocol 5 framing) where libev
    failed none: a slower exit beats a mailbox write that cannot land. ADR-0014."""
    if reactor == "libev":
        from cassandra.io.libevreactor import LibevConnection

        return LibevConnection
    if reactor != "asyncio":
        raise ValueError(f"reactor={reactor!r}: asyncio or libev")
    return AsyncioConnection


def open_cluster(
    hosts: Iterable[str], port: int, datacenter: str, consistency: str, reactor: str = "libev"
) -> tuple[Cluster, Session]:
    """A cluster of protocol 5, token-aware routing over the local datacenter, the
    settings' consistency for reads and writes, rows as dicts; the reactor: see
    _connection_class."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=datacenter)),
        consistency_level=ConsistencyLevel.name_to_value[consistency],
        request_timeout=TIMEOUT,
        row_factory=dict_factory,
    )
    cluster = Cluster(
        list(hosts),
        port=port,
        protocol_version=5,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connection_class=_connection_class(reactor),
        reconnection_policy=ExponentialReconnectionPolicy(*RECONNECT_DELAYS),
    )
    try:
        return cluster, cluster.connect()
    except BaseException:
        cluster.shutdown()
        raise


def create_keyspace(session: Session, keyspace: str, replication: int, datacenter: str, tables: list[str]) -> None:
    """The keyspace and `tables` (CQL with {ks} and {id}, {name} for the id) if absent:
    idempotent, harmless when two processes race; waits for schema agreement."""
    if datacenter and replication > 1:
        strategy = f"{{'class': 'NetworkTopologyStrategy', '{datacenter}': {replication}}}"
    else:
        strategy = f"{{'class': 'SimpleStrategy', 'replication_factor': {replication}}}"
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {strategy}", timeout=120)
    for name, ddl in tables_by_name(tables):
        session.execute(ddl.format(ks=keyspace, id=table_id(keyspace, name)), timeout=120)
    # Session.wait_for_schema_agreement reads schema_version as an attribute: with rows
    # as dicts it never agrees (scylla-driver 3.29); the control connection's check works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        agreed = session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)
    if not agreed:
        raise RuntimeError(f"Cassandra: no schema agreement on keyspace {keyspace} within 60 s")


def tables_by_name(tables: list[str]) -> Iterator[tuple[str, str]]:
    for ddl in tables:
        head = ddl.split("(", 1)[0].split()
        yield head[-1].split(".")[-1], ddl


class CassandraMailbox:
    """A MailboxStore on Cassandra. Give it a session (shared with other stores; then
    close() leaves the cluster open) or open one with `connect`."""

    def __init__(self, session: Session, keyspace: str, *, cluster: Cluster | None = None) -> None:
        self.session = session
        self.keyspace = keyspace
        self._cluster = cluster  # shut down by close() when this store opened it
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
        """Open a cluster, create the keyspace and the table if absent."""
        cluster, session = open_cluster(hosts, port, datacenter, consistency, reactor)
        try:
            create_keyspace(session, keyspace, replication, datacenter, [MAILBOX_TABLE])
            return cls(session, keyspace, cluster=cluster)
        except BaseException:
            cluster.shutdown()
            raise

    @classmethod
    def from_settings(cls, settings: Any) -> CassandraMailbox:
        """From an object with hosts, port, keyspace, replication, consistency, datacenter
        (fanout.urls.CassandraSettings)."""
        return cls.connect(
            settings.hosts,
            settings.port,
            settings.keyspace,
            replication=settings.replication,
            consistency=settings.consistency,
            datacenter=settings.datacenter,
        )

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
        run(self.session, ((b, None) for b in self.batches(tenant, refs)))
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
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None


def run(session: Session, statements: Iterable[tuple[Any, Any]], concurrency: int = IN_FLIGHT) -> None:
    """Execute statements with at most `concurrency` in flight; the first error raises."""
    execute_concurrent(session, statements, concurrency=concurrency, raise_on_first_error=True)
