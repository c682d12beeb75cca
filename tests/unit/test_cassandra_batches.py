"""adapters/cassandra/batches.py writes the very bytes the driver writes for the same batch
(ADR-0039): the statements serialized here, a run of them joined around one varying value,
and the tail (consistency, flags, timestamp, keyspace) the driver's own. Runs against a real
Cassandra: tests/contract/test_mailbox_store.py and the views' suites."""

from __future__ import annotations

import struct

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.protocol import BatchMessage
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.cassandra.batches import Encoded, PackedStatements, cell, grouped, install, run_of, statement, template

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
    head, tail = template(QUERY_ID, before, after)
    run = run_of(head, tail, [cell(v) for v in varying], b"key")
    assert run.rows == len(varying)
    assert run.body == b"".join(statement(QUERY_ID, [*before, v, *after]) for v in varying)


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
