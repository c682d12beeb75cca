"""adapters/cassandra/batches.py writes the very bytes the driver writes for the same batch
(ADR-0039): the statements serialized here, a run of them joined around one varying value,
and the tail (consistency, flags, timestamp, keyspace) the driver's own. Runs against a real
Cassandra: tests/contract/test_mailbox_store.py and the views' suites."""

from __future__ import annotations

import struct
import zlib

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.cqltypes import BooleanType, BytesType, DoubleType, Int32Type, LongType, MapType, UTF8Type
from cassandra.protocol import BatchMessage, ColumnMetadata
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.cassandra.batches import (
    Encoded,
    PackedStatements,
    bound,
    cell,
    grouped,
    install,
    joined,
    prefix,
    statement,
)
from adapters.cassandra.session_heads import SESSION_HEAD_VALUES, session_head_cells
from adapters.cassandra.session_states import copy_cells

QUERY_ID = bytes(range(16))
values = st.lists(st.one_of(st.binary(max_size=40), st.none(), st.just(UNSET_VALUE)), min_size=1, max_size=9)


class _Session:
    client_protocol_handler = Session.client_protocol_handler


def packed_bytes(parts: list[bytes], count: int, **kw) -> bytes:
    """The frame body the installed handler writes for a PackedStatements batch."""
    session = _Session()
    install(session)
    packed = PackedStatements()
    packed.parts, packed.count = parts, count
    message = BatchMessage(BatchType.UNLOGGED, packed, ConsistencyLevel.QUORUM, **kw)
    frame = session.client_protocol_handler.encode_message(message, 7, 5, None, False, None)
    return frame[9:]  # the frame's header: version, flags, stream, opcode, length


def frame_of_driver(statements: list[tuple[bytes, list]], **kw) -> bytes:
    message = BatchMessage(BatchType.UNLOGGED, [(True, q, v) for q, v in statements], ConsistencyLevel.QUORUM, **kw)
    return Session.client_protocol_handler.encode_message(message, 7, 5, None, False, None)[9:]


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=20), st.sampled_from([{}, {"timestamp": 123456789, "keyspace": "ks"}]))
def test_statements_serialized_here_are_the_drivers_bytes(rows: list[list], kw: dict) -> None:
    statements = [(QUERY_ID, v) for v in rows]
    assert packed_bytes([statement(QUERY_ID, v) for v in rows], len(rows), **kw) == frame_of_driver(statements, **kw)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=8), max_size=4),
    st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=30),
    st.lists(st.binary(max_size=8), max_size=4),
)
def test_a_run_is_each_statement_with_its_value(before: list[bytes], varying: list[bytes], after: list[bytes]) -> None:
    head = prefix(QUERY_ID, len(before) + 1 + len(after)) + b"".join(map(cell, before))
    run = joined(head, b"".join(map(cell, after)), [cell(v) for v in varying])
    assert run == b"".join(statement(QUERY_ID, [*before, v, *after]) for v in varying)


def test_grouped_keeps_a_run_whole_and_under_the_size() -> None:
    """Runs are never split and never push a batch past the size (a run longer than it is
    alone)."""
    runs = [Encoded(b"x" * n, n, bytes([n])) for n in (98, 97, 3, 2, 120, 1)]
    sizes = [len(b) for b, _ in grouped(runs, 100, "ks")]
    assert sizes == [98, 100, 2, 120, 1]
    firsts = [b.routing_key for b, _ in grouped(runs, 100, "ks")]
    assert firsts == [bytes([98]), bytes([97]), bytes([2]), bytes([120]), bytes([1])]


def test_a_packed_batch_on_a_session_without_the_handler_fails_loudly() -> None:
    """The driver's own encoder cannot write PackedStatements: an error, never a wrong frame."""
    (batch, _), *_ = grouped([Encoded(statement(QUERY_ID, [b"a"]), 1, b"k")], 100, "ks")
    assert isinstance(batch, BatchStatement)
    message = BatchMessage(BatchType.UNLOGGED, batch._statements_and_parameters, ConsistencyLevel.ONE)
    with pytest.raises(TypeError):
        Session.client_protocol_handler.encode_message(message, 7, 5, None, False, None)


def test_install_is_idempotent() -> None:
    session = _Session()
    install(session)
    first = session.client_protocol_handler
    install(session)
    assert session.client_protocol_handler is first


def test_statement_lengths() -> None:
    body = statement(QUERY_ID, [b"ab", None, UNSET_VALUE])
    assert body == b"\x01" + struct.pack(">H", 16) + QUERY_ID + struct.pack(">H", 3) + (
        struct.pack(">i", 2) + b"ab" + struct.pack(">i", -1) + struct.pack(">i", -2)
    )


# -- the mailbox's rows (adapters/cassandra/mailbox.py), read back statement by statement -----


def parse(body: bytes) -> list[tuple[bytes, list[bytes]]]:
    """The statements of a batch body's parts: (query id, values)."""
    out, i = [], 0
    while i < len(body):
        assert body[i] == 1
        (n,) = struct.unpack_from(">H", body, i + 1)
        qid = body[i + 3 : i + 3 + n]
        i += 3 + n
        (count,) = struct.unpack_from(">H", body, i)
        i += 2
        values = []
        for _ in range(count):
            (length,) = struct.unpack_from(">i", body, i)
            values.append(body[i + 4 : i + 4 + length])
            i += 4 + length
        out.append((qid, values))
    return out


class _Statements:
    class insert:  # noqa: N801 (a stand-in for the prepared statement: only its id is read)
        query_id = QUERY_ID

    class mark_hour:  # noqa: N801
        query_id = QUERY_ID[::-1]


def _mailbox():  # type: ignore[no-untyped-def]
    from adapters.cassandra.mailbox import CassandraMailbox

    store = CassandraMailbox.__new__(CassandraMailbox)  # no session: rows() only serializes
    store.statements = _Statements()
    store._partition_lists = {}
    store._hours_kept = {}
    return store


members = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=300, unique=True)


@settings(max_examples=150, deadline=None)
@given(
    members,
    st.data(),
    st.integers(min_value=0, max_value=2**40),  # log positions (stamps.py's range)
    st.integers(min_value=0, max_value=7),
    st.floats(min_value=0, max_value=4e9),
    st.booleans(),
)
def test_the_mailbox_rows_are_each_members_insert_once_routed_by_its_partition(
    users: list[str], data: st.DataObject, pos: int, flags: int, at: float, cached: bool
) -> None:
    """Every member of the message gets exactly one INSERT with its values (special members
    their own flags, a special user who is not a member none); each part is at most
    BATCH_ROWS statements and is routed by its first statement's partition; a part of
    several partitions is a small message's (no part splits a partition's run of under
    BATCH_ROWS rows)."""
    from adapters.cassandra.batches import routing_key
    from adapters.cassandra.mailbox import BATCH_ROWS, CACHED_LIST, hour_of, unref
    from adapters.cassandra.stamps import stamp
    from projections.ports import MessageRefs
    from projections.sharding import shard_of

    special = data.draw(st.dictionaries(st.sampled_from([*users, "not-a-member"]), st.integers(0, 31), max_size=4))
    by: dict[int, list[str]] = {}
    for u in sorted(users):
        by.setdefault(shard_of(u, 4), []).append(u)
    versions = dict.fromkeys(by, 1) if cached else None
    refs = MessageRefs("c/1", pos, pos + 1, flags, special, by, versions, at=at)
    store = _mailbox()
    if cached:
        import adapters.cassandra.mailbox as mailbox

        mailbox.CACHED_LIST, before = 1, CACHED_LIST  # every list cached: the cached path
    try:
        parts = store.rows([("tenant-é", refs)]) + (store.rows([("tenant-é", refs)]) if cached else [])
    finally:
        if cached:
            mailbox.CACHED_LIST = before
    seen: dict[bytes, list[bytes]] = {}
    hour = struct.pack(">q", hour_of(at))
    for part in parts:
        statements = parse(part.body)
        assert len(statements) == part.rows <= BATCH_ROWS
        shard, h = statements[0][1][1:3]
        assert part.key == routing_key((shard, h))  # the partition: (shard, hour), every tenant's (ADR-0050)
        for qid, values in statements:
            assert qid == QUERY_ID and len(values) == 7
            t, shard, h, user, p, entry, ts = values
            assert (t, h) == ("tenant-é".encode(), hour)
            assert struct.unpack(">i", shard)[0] == zlib.crc32(user) % 1024
            assert (p, ts) == (struct.pack(">q", pos), struct.pack(">q", stamp(pos)))
            seq, cid, f = unref(entry)
            assert (seq, cid) == (pos + 1, "c/1")
            seen.setdefault(user, []).append(f)
    expected = {u.encode(): [special.get(u, flags)] * (2 if cached else 1) for u in users}
    assert seen == expected


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acme", "beta"]),
            st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=250, unique=True),
            st.integers(min_value=0, max_value=2),  # the hour
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([1, 2, 256]),  # (tenant, hour)s kept: 1 and 2 rebuild them within the unit
)
def test_a_units_mailbox_rows_are_grouped_by_partition_across_its_messages(
    messages: list[tuple[str, list[str], int]], kept: int
) -> None:
    """ADR-0046: the rows of a unit's messages (tenants, hours, members overlapping) come out
    with each member's insert once per message, each part at most BATCH_ROWS statements routed
    by its first statement's partition, the parts in token order, and each partition's
    statements consecutive (one batch, one mutation, unless a part boundary falls inside),
    whatever tenants they belong to: a partition is (shard, hour), every tenant's (ADR-0050)."""
    from cassandra.murmur3 import murmur3

    from adapters.cassandra.batches import routing_key
    from adapters.cassandra.mailbox import BATCH_ROWS, HOUR
    from projections.ports import MessageRefs
    from projections.sharding import shard_of

    store = _mailbox()
    unit = []
    for i, (tenant, users, hour) in enumerate(messages):
        by: dict[int, list[str]] = {}
        for u in sorted(users):
            by.setdefault(shard_of(u, 4), []).append(u)
        unit.append((tenant, MessageRefs(f"c{i}", 100 + i, 1, 0, {}, by, None, at=hour * HOUR + 1.0)))
    import adapters.cassandra.mailbox as mailbox

    mailbox.HOURS_KEPT, before = kept, mailbox.HOURS_KEPT
    try:
        parts = store.rows(unit)
    finally:
        mailbox.HOURS_KEPT = before
    assert len(store._hours_kept) <= kept
    seen: dict[tuple[bytes, bytes, bytes], list[int]] = {}
    order: list[bytes] = []  # each statement's routing key, in the order sent
    for part in parts:
        statements = parse(part.body)
        assert len(statements) == part.rows <= BATCH_ROWS
        assert part.key == routing_key(tuple(statements[0][1][1:3]))
        for _, (t, shard, h, user, p, _, _) in statements:
            order.append(routing_key((shard, h)))
            seen.setdefault((t, h, user), []).append(struct.unpack(">q", p)[0])
    tokens = [murmur3(k) for k in order]
    assert tokens == sorted(tokens)
    runs = [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]
    assert len(runs) == len(set(runs)), "a partition's statements are not consecutive"
    expected: dict[tuple[bytes, bytes, bytes], list[int]] = {}
    for i, (tenant, users, hour) in enumerate(messages):
        for u in users:
            expected.setdefault((tenant.encode(), struct.pack(">q", hour), u.encode()), []).append(100 + i)
    assert {k: sorted(v) for k, v in seen.items()} == expected


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.text(max_size=40),  # conversation ids are the client's: any text, any length
)
def test_an_entrys_ref_cell_reads_back_what_was_written(seq: int, flags: int, conversation_id: str) -> None:
    """ADR-0040's one cell: seq, flags and the conversation id come back as written, whatever
    the id holds (a NUL, a digit at its start, characters outside the BMP)."""
    from adapters.cassandra.mailbox import ref, unref

    value = ref(struct.pack(">q", seq), flags, conversation_id.encode())
    assert unref(value) == (seq, conversation_id, flags)


head_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    head_text,
    st.integers(0, 2**31 - 1),
    head_text,
    st.tuples(
        st.none() | head_text,
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | head_text,
        st.none() | st.floats(allow_nan=False),
        st.none() | head_text,
    ),
    st.integers(-(2**63), 2**63 - 1),
)
def test_a_session_heads_row_is_serialized_as_the_driver_would(
    tenant: str, shard: int, conversation_id: str, head: tuple, ts: int
) -> None:
    """ADR-0042: the copy's insert is serialized here; its cells are the driver's encoding of
    each column's type (text, int, bigint, double), a null as length -1."""
    types = (UTF8Type, Int32Type, UTF8Type, UTF8Type, LongType, LongType, UTF8Type, DoubleType, UTF8Type, LongType)
    values = (tenant, shard, conversation_id, *head, ts)
    assert len(values) == SESSION_HEAD_VALUES
    expected = b"".join(cell(None if v is None else t.serialize(v, 4)) for t, v in zip(types, values, strict=True))
    assert session_head_cells(tenant.encode(), shard, conversation_id, head, ts) == expected


@settings(max_examples=300, deadline=None)
@given(head_text, head_text, head_text, st.binary(max_size=60), st.integers(-(2**63), 2**63 - 1))
def test_a_session_states_row_is_serialized_as_the_driver_would(
    tenant: str, user_id: str, conversation_id: str, state: bytes, ts: int
) -> None:
    """ADR-0043: the copy's insert, cell update and delete are serialized here; their cells
    are the driver's encoding of text, blob and bigint."""
    for types, row in (
        ((UTF8Type, UTF8Type, UTF8Type, BytesType, LongType), (tenant, user_id, conversation_id, state, ts)),
        ((LongType, BytesType, UTF8Type, UTF8Type, UTF8Type), (ts, state, tenant, user_id, conversation_id)),
        ((LongType, UTF8Type, UTF8Type, UTF8Type), (ts, tenant, user_id, conversation_id)),
    ):
        expected = b"".join(cell(t.serialize(v, 4)) for t, v in zip(types, row, strict=True))
        assert copy_cells(row) == expected


# -- ADR-0053: a prepared statement's values serialized here, as the driver's bind does ----------

_COLUMNS = [
    ("tenant", UTF8Type),
    ("user_id", UTF8Type),
    ("seq", LongType),
    ("flags", Int32Type),
    ("skipping", BooleanType),
    ("score", DoubleType),
    ("ref", BytesType),
    ("body", MapType.apply_parameters([UTF8Type, UTF8Type])),
]


def _prepared(key_indexes: list[int]) -> PreparedStatement:
    meta = [ColumnMetadata("ks", "t", name, kind) for name, kind in _COLUMNS]
    return PreparedStatement(meta, QUERY_ID, key_indexes, "INSERT ...", "ks", 5, [], None)


_cells = st.tuples(
    st.text(max_size=12),
    st.text(max_size=12),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(max_size=12),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(
    _cells, st.lists(st.sampled_from([2, 3, 4, 5, 6, 7]), unique=True, max_size=3), st.sampled_from([[0], [0, 1], []])
)
def test_a_binder_serializes_values_and_routing_key_as_the_drivers_bind(
    cells: tuple, absent: list[int], key: list[int]
) -> None:
    """Every type the views' tables use, nulls and unset values among them: the same statement
    bytes and routing key as the driver's BoundStatement for the same values."""
    values = [None if i in absent[:1] else UNSET_VALUE if i in absent[1:] else v for i, v in enumerate(cells)]
    prepared = _prepared(key)
    driver = prepared.bind(values)
    ours = bound(prepared, values)
    assert ours.body == statement(QUERY_ID, driver.values)
    assert ours.key == driver.routing_key and ours.rows == 1


def test_a_binder_refuses_what_the_driver_refuses_with_the_column_named() -> None:
    prepared = _prepared([0])
    with pytest.raises(TypeError, match="'seq'"):
        bound(prepared, ["acme", "u1", "not a number", 1, True, 1.0, b"", {}])
    with pytest.raises(ValueError, match="7 values for a statement of 8"):
        bound(prepared, ["acme", "u1", 1, 1, True, 1.0, b""])
    with pytest.raises(ValueError, match="partition key"):
        bound(prepared, [None, "u1", 1, 1, True, 1.0, b"", {}])
