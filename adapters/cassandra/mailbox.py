"""Cassandra backend of the mailbox (UserMailboxEntry), the O(N) write of a message.

Partition (shard, hour), clustering (tenant, user_id, pos) (ADR-0038, ADR-0050): `shard` is
the member's MailboxShard among PARTITION_SHARDS (crc32 of the user id, projections/sharding.py),
`hour` the hour of the message's acceptance (`MessageRefs.at`, from the event: the same on every
replay). The partitions are the cluster's, shared by every tenant (ADR-0003's MailboxShard is a
mailbox node's share, not a tenant's): inside Cassandra each partition a batch touches is one
mutation (~100 us of its CPU here), so a message to N members costs at most PARTITION_SHARDS
mutations instead of N (PERFORMANCE.md section 19: 13-17 against 100-108 us of Cassandra CPU an
entry), and a unit of work's small messages cost about one mutation per partition they touch
whatever tenants they belong to (ADR-0050; keyed by tenant hour, 300 tenants' entries each fell
in a partition of its own). The hour bounds a partition (the rows of 1/PARTITION_SHARDS of all
members for one hour). A unit of work's rows come out grouped by partition across its messages,
in token order (ADR-0046), packed into UNLOGGED batches of BATCH_ROWS rows with up to IN_FLIGHT
in the air: a large message's batches each touch one partition.

`mailbox_hours` keeps each tenant hour's last position (the cell with the highest position
wins: its write timestamp is the stamp of that position). A cursor read (`read`) lists the
tenant's hours from the newest back to the cursor, then reads the user's rows in those hours,
oldest first, READ_WINDOW hours a request, and stops once `limit` rows are certain to be the first:
it assumes a message of hour h has a greater position than every message of hour h - MARGIN -
1 or earlier, i.e. the replicas' clocks are within an hour of each other: each API replica
refuses writes while its clock is further than FANOUT_MAX_CLOCK_SKEW (5 minutes, at most 30)
from PostgreSQL's (fanout/clock_guard.py, ADR-0041).

Every row is an upsert of the same key with the same values and the same write timestamp (the
message's log position, adapters/cassandra/stamps.py), so writing the same refs again changes
nothing. docs/adr/0014-cassandra-data-model.md, docs/adr/0038-mailbox-partitions-by-shard.md,
docs/adr/0046-mailbox-rows-grouped-across-a-unit.md, docs/adr/0050-mailbox-partitions-shared-by-tenants.md."""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import Any, NamedTuple

from cassandra.cluster import Session
from cassandra.murmur3 import murmur3
from cassandra.query import BatchStatement, PreparedStatement

from adapters.cassandra.batches import Encoded, cell, grouped, install, joined, key_component, prefix, statement
from adapters.cassandra.connect import TUPLE_ROWS, ClusterSettings, Connection, open_session, run
from adapters.cassandra.errors import cassandra_boundary
from adapters.cassandra.schema import MAILBOX_TABLES
from adapters.cassandra.stamps import stamp
from projections.ports import MailboxEntry, MessageRefs

BATCH_ROWS = 100  # rows per UNLOGGED batch (100 x ~60 bytes: far below the 64 KiB size warning)
IN_FLIGHT = 200  # batches in the air at once
PARTITION_SHARDS = 1024  # partitions of an hour, every tenant's (ADR-0038, ADR-0050; measured against 256: section 19)
HOUR = 3600.0  # seconds of a partition's hour
MARGIN = 2  # hours a cursor read reads past what it returns (clock skew between replicas)
READ_WINDOW = 32  # hours a cursor read reads in one request (`hour IN`)
HOURS_KEPT = 256  # (tenant, hour)s whose partitions' statement heads, keys and tokens are kept
CACHED_LIST = 1000  # members of a MailboxShard list from which its partition grouping is cached
INSERT_ENTRY = (
    "INSERT INTO {ks}.mailbox (tenant, shard, hour, user_id, pos, ref) "
    "VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"  # the message's log position (stamps.py)
)
MARK_HOUR = "UPDATE {ks}.mailbox_hours USING TIMESTAMP ? SET last_pos = ? WHERE tenant = ? AND hour = ?"


_BIGINT = struct.Struct(">q")
_INT = struct.Struct(">i")


_REF = struct.Struct(">qi")  # an entry's ref: conversation seq, flags, then the conversation id (UTF-8)


def ref(seq: bytes, flags: int, conversation_id: bytes) -> bytes:
    """An entry's `ref` cell (ADR-0040): its conversation seq (8 bytes, as packed), flags, conversation."""
    return seq + _INT.pack(flags) + conversation_id


def unref(value: bytes) -> tuple[int, str, int]:
    """(conversation seq, conversation id, flags) of a `ref` cell."""
    seq, flags = _REF.unpack_from(value)
    return seq, value[_REF.size :].decode(), flags


def hour_of(at: float) -> int:
    """The hour (since the epoch) of a message accepted at `at` (seconds)."""
    return int(at // HOUR)


def _first(piece: tuple[int, bytes, bytes, int]) -> int:
    return piece[0]


def partition_shard(user: bytes) -> int:
    """The member's shard among PARTITION_SHARDS (projections.sharding.shard_of, on bytes)."""
    return zlib.crc32(user) % PARTITION_SHARDS


class Statements(NamedTuple):
    """The mailbox's writes, prepared on a session (the views' or the store's own)."""

    insert: PreparedStatement
    mark_hour: PreparedStatement

    @classmethod
    def prepare(cls, session: Session, keyspace: str) -> Statements:
        return cls(session.prepare(INSERT_ENTRY.format(ks=keyspace)), session.prepare(MARK_HOUR.format(ks=keyspace)))


# Each partition shard's value, its cell in a statement, its component of a routing key.
_SHARD_VALUES = [_INT.pack(p) for p in range(PARTITION_SHARDS)]
_SHARD_CELLS = [cell(v) for v in _SHARD_VALUES]
_SHARD_KEYS = [key_component(v) for v in _SHARD_VALUES]


class _Hour:
    """A tenant's rows in the partitions of an hour: for each partition shard used, the head of
    the tenant's insert statements there (lead, tenant, shard, hour), the partition's routing
    key (shard, hour: every tenant's, ADR-0050) and its Murmur3 token, built when first used
    (ADR-0046)."""

    __slots__ = ("head", "hour_cell", "key_hour", "parts")

    def __init__(self, query_id: bytes, tenant: str, hour: int) -> None:
        h = _BIGINT.pack(hour)
        self.head, self.hour_cell = prefix(query_id, 7) + cell(tenant.encode()), cell(h)
        self.key_hour = key_component(h)
        self.parts: dict[int, tuple[bytes, bytes, int]] = {}

    def part(self, p: int) -> tuple[bytes, bytes, int]:
        got = self.parts.get(p)
        if got is None:
            key = _SHARD_KEYS[p] + self.key_hour
            got = self.parts[p] = (self.head + _SHARD_CELLS[p] + self.hour_cell, key, murmur3(key))
        return got


@cassandra_boundary  # the driver's errors raised as the port errors (errors.py)
class CassandraMailbox:
    """A MailboxStore on Cassandra. Give it a session (shared with the views: close() then
    leaves the Cluster to its owner) or open one with `from_settings` / `connect`."""

    def __init__(self, session: Session, keyspace: str, *, connection: Connection | None = None) -> None:
        """`connection`: the session's Connection when this store owns it (close() closes it)."""
        self.session = session
        self.keyspace = keyspace
        self._connection = connection
        install(session)  # its batches are serialized here (a session not opened by connect.py)
        ks = keyspace
        self.statements = Statements.prepare(session, ks)
        self._read: PreparedStatement = session.prepare(
            f"SELECT pos, ref FROM {ks}.mailbox "
            "WHERE shard=? AND hour IN ? AND tenant=? AND user_id=? AND pos>? AND pos<=? PER PARTITION LIMIT ?"
        )  # one request for a window of hours: each hour (partition) gives its first `limit` rows
        self._hours: PreparedStatement = session.prepare(
            f"SELECT hour, last_pos FROM {ks}.mailbox_hours WHERE tenant=? ORDER BY hour DESC"
        )
        self._hours.fetch_size = 1000
        self.read_window = READ_WINDOW  # hours a cursor read reads in one request (tests make it 1 or 2)
        # (tenant, conversation, MailboxShard) -> (list version, members, its partitions)
        self._partition_lists: dict[tuple[str, str, int], tuple[int, int, list[tuple[int, list[bytes]]]]] = {}
        self._hours_kept: dict[tuple[bytes, str, int], _Hour] = {}

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
        connection = open_session(settings, tables=MAILBOX_TABLES, reactor=reactor)
        try:
            return cls(connection.session, settings.keyspace, connection=connection)
        except BaseException:
            connection.close()
            raise

    # -- writing -------------------------------------------------------------------

    def rows(self, messages: Iterable[tuple[str, MessageRefs]], statements: Statements | None = None) -> list[Encoded]:
        """The insert of each entry of `messages` (a unit of work's: (tenant, refs) each),
        serialized here (adapters/cassandra/batches.py, ADR-0039), grouped by partition ACROSS
        the messages and in token order (ADR-0046): inside Cassandra each partition a batch
        touches is one mutation, so a unit of many small messages, whose members fall in many
        partitions, costs about one mutation per partition it touches, not one per entry; and
        neighbouring partitions in token order share a replica (one coordinator hop on a
        cluster). The statements of one message and partition differ only in the member, so a
        partition's are one `joined` around its members' cells (0.1 us a row of client CPU for
        a large message against 7-8 us with the driver serializing each row). Parts of at most
        BATCH_ROWS statements; a partition's piece (at most BATCH_ROWS) is never split, and the
        pieces of one partition are consecutive: a large message's partition is a part (a
        batch, one mutation) of its own, small messages' partitions share parts. The views'
        unit of work packs them into its first round with the other member-keyed rows, with
        `statements` prepared on its session; `hour_rows` gives the hours' rows of the same
        messages."""
        query_id = (statements or self.statements).insert.query_id
        pieces: list[tuple[int, bytes, bytes, int]] = []  # (token, routing key, statements, how many)
        for tenant, refs in messages:
            self._pieces(tenant, refs, query_id, pieces)
        pieces.sort(key=_first)  # stable: one partition's pieces stay in log order
        out: list[Encoded] = []
        chunk: list[bytes] = []  # statements of consecutive partitions, at most BATCH_ROWS
        count, chunk_key = 0, b""
        for _, key, body, n in pieces:
            if count and count + n > BATCH_ROWS:  # a partition's piece is not split
                out.append(Encoded(b"".join(chunk), count, chunk_key))
                chunk, count = [], 0
            if not count:
                chunk_key = key
            chunk.append(body)
            count += n
        if count:
            out.append(Encoded(b"".join(chunk), count, chunk_key))
        return out

    def _pieces(
        self, tenant: str, refs: MessageRefs, query_id: bytes, out: list[tuple[int, bytes, bytes, int]]
    ) -> None:
        """One message's inserts, appended to `out` as (token, routing key, statements, how
        many) per partition: its special members' first, then runs of at most BATCH_ROWS."""
        part = self._hour(query_id, tenant, hour_of(refs.at)).part
        # a statement: its partition's head (lead, tenant, shard, hour), the member, then the
        # position, the ref, the stamp
        pos_cell, end = cell(_BIGINT.pack(refs.pos)), cell(_BIGINT.pack(stamp(refs.pos)))
        seq, cid = _BIGINT.pack(refs.seq), refs.conversation_id.encode()
        tail = pos_cell + cell(ref(seq, refs.flags, cid)) + end
        special: dict[int, list[tuple[bytes, int]]] = {}  # partition shard -> its special members' cells, flags
        for u, f in refs.special.items():
            user = u.encode()
            special.setdefault(partition_shard(user), []).append((cell(user), f))
        add = out.append
        for shard in sorted(refs.shards):
            for p, cells in self._partitions(tenant, refs, shard):
                head, key, token = part(p)
                own = special.get(p)
                if own:
                    present = sorted((c, f) for c, f in own if c in cells)  # members only
                    if present:
                        skip = {c for c, _ in present}
                        cells = [c for c in cells if c not in skip]
                        body = b"".join(head + c + pos_cell + cell(ref(seq, f, cid)) + end for c, f in present)
                        add((token, key, body, len(present)))
                if len(cells) == 1:
                    add((token, key, head + cells[0] + tail, 1))
                    continue
                for i in range(0, len(cells), BATCH_ROWS):
                    run = cells[i : i + BATCH_ROWS] if len(cells) > BATCH_ROWS else cells
                    add((token, key, joined(head, tail, run), len(run)))

    def _hour(self, query_id: bytes, tenant: str, hour: int) -> _Hour:
        """A tenant's rows in an hour's partitions (`_Hour`), kept for the HOURS_KEPT last used."""
        key = (query_id, tenant, hour)
        got = self._hours_kept.get(key)
        if got is None:
            if len(self._hours_kept) >= HOURS_KEPT:
                self._hours_kept.pop(next(iter(self._hours_kept)))  # the oldest built
            got = self._hours_kept[key] = _Hour(query_id, tenant, hour)
        return got

    def _partitions(self, tenant: str, refs: MessageRefs, shard: int) -> list[tuple[int, list[bytes]]]:
        """One MailboxShard list's members grouped by partition shard, each member's user_id as a
        statement carries it (batches.cell), in partition order: cached per
        member-list version for lists of CACHED_LIST members or more (ADR-0004's cache, as
        adapters/rocksdb/mailbox.py keeps it), so a large group's message only builds its rows."""
        users = refs.shards[shard]
        version = refs.versions.get(shard) if refs.versions is not None else None
        key = (tenant, refs.conversation_id, shard)
        if version is not None:
            cached = self._partition_lists.get(key)
            if cached is not None and cached[0] == version and cached[1] == len(users):
                return cached[2]
        by_shard: dict[int, list[bytes]] = {}
        pack = _INT.pack
        for u in users:
            user = u.encode()
            p = zlib.crc32(user) % PARTITION_SHARDS  # partition_shard(user), inline: a call a member
            c = pack(len(user)) + user  # cell(user)
            got = by_shard.get(p)
            if got is None:
                by_shard[p] = [c]
            else:
                got.append(c)
        out = sorted(by_shard.items())
        if version is not None and len(users) >= CACHED_LIST:
            self._partition_lists[key] = (version, len(users), out)
        return out

    def hour_rows(
        self, messages: Iterable[tuple[str, MessageRefs]], statements: Statements | None = None
    ) -> list[Encoded]:
        """Each (tenant, hour)'s last position among `messages` (one row each, stamped with that
        position: the highest position written to an hour wins, whoever writes it last)."""
        query_id = (statements or self.statements).mark_hour.query_id
        last: dict[tuple[str, int], int] = {}
        for tenant, refs in messages:
            if not refs.shards:
                continue
            key = (tenant, hour_of(refs.at))
            if last.get(key, -1) < refs.pos:
                last[key] = refs.pos
        out = []
        for (tenant, hour), pos in sorted(last.items()):
            t = tenant.encode()
            values = [_BIGINT.pack(stamp(pos)), _BIGINT.pack(pos), t, _BIGINT.pack(hour)]
            out.append(Encoded(statement(query_id, values), 1, t))
        return out

    def batches(self, tenant: str, refs: MessageRefs) -> Iterator[BatchStatement]:
        """UNLOGGED batches of BATCH_ROWS rows (grouped by partition), then the hour's row."""
        rows = [*self.rows([(tenant, refs)]), *self.hour_rows([(tenant, refs)])]
        for batch, _ in grouped(rows, BATCH_ROWS, self.keyspace):
            yield batch

    def write(self, tenant: str, refs: MessageRefs) -> int:
        run(self.session, ((b, None) for b in self.batches(tenant, refs)), IN_FLIGHT)
        return sum(len(users) for users in refs.shards.values())

    # -- reading -------------------------------------------------------------------

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        """The user's entries with after < pos <= until, the first `limit` in pos order: the
        tenant's hours that may hold them (module doc), then the user's rows of those hours,
        READ_WINDOW hours a request, oldest first, until `limit` rows are certain."""
        if limit <= 0 or until <= after:
            return []
        listing: list[tuple[int, int]] = []  # (hour, last position), newest first
        older = 0
        for hour, last in self.session.execute(self._hours, (tenant,), execution_profile=TUPLE_ROWS):
            listing.append((hour, last))
            older = older + 1 if last <= after else 0
            if older > MARGIN:
                break
        listing.reverse()
        hours = [h for h, last in listing if last > after]
        listed = [h for h, _ in listing]
        highest = list(accumulate((last for _, last in listing), max))  # the last position up to each hour
        shard = partition_shard(user_id.encode())
        found: list[tuple[int, bytes]] = []
        step = self.read_window
        for i in range(0, len(hours), step):
            window = hours[i : i + step]
            rows = self.session.execute(
                self._read, (shard, window, tenant, user_id, after, until, limit), execution_profile=TUPLE_ROWS
            )
            found.extend(rows)
            if i + step >= len(hours):
                break
            # every row of a later hour comes after the last position of any hour MARGIN
            # hours before it: the rows at or below that are final
            below = bisect_right(listed, window[-1] - MARGIN)
            if below and sum(1 for r in found if r[0] <= highest[below - 1]) >= limit:
                break
        found.sort()
        return [(user_id, pos, *unref(r)) for pos, r in found[:limit]]

    def count(self) -> int:
        """A scan of the table (tools and tests)."""
        row = self.session.execute(f"SELECT count(*) AS n FROM {self.keyspace}.mailbox", timeout=300).one()
        return int(row["n"])

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        """A scan of the table, sorted here (the table is in token order)."""
        rows = self.session.execute(f"SELECT tenant, user_id, pos, ref FROM {self.keyspace}.mailbox", timeout=300)
        yield from sorted((r["tenant"], r["user_id"], r["pos"], *unref(r["ref"])) for r in rows)

    def written(self) -> int | None:
        return None  # the views record the unit that wrote them; a lost write heals from the log (ADR-0021)

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
