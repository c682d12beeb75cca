"""The login's copy of a user's states (ADR-0043): what a login needs of each of a user's
state rows (projections/state.py SessionState) packed in ONE cell, in the table
`session_states ((tenant, user_id), conversation_id)` (DDL in schema.py). Cassandra's CPU
to read a partition is paid per cell: the seven columns of 5,000 rows took ~70 ms of it and
of the wall clock, the one cell ~26-45 ms (docs/PERFORMANCE.md section 23).

The copy is written with its `user_states` row, by the same unit, with the same stamp, in the
same batch (`paired`): the two have one partition key in one keyspace, so Cassandra applies
them as one mutation, and the copy holds a row exactly when `user_states` does. A login can
therefore read the copy alone, but only where every row of `user_states` was written that
way: a keyspace whose `user_states` had rows before the copy existed has not. That is what
the marker says (`vouch`, `vouched`): written when the copy's table is created beside an
empty `user_states` (schema.py create_schema), or when a rebuild has merged both; a login
without it reads `user_states` as before."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from adapters.cassandra.batches import Encoded, cell, prefix, statement
from projections.state import SessionState

# "No value" of a nullable seq (delivered, gap end), in user_states' columns (writer.py) and in
# the copy's cell alike. A null written by an INSERT is a tombstone: two per member row (no gap
# is the common case) made a 100k-member partition 200k tombstones, read on every load of the
# conversation, and that ran Cassandra out of heap in the crash tests. Seqs are >= 0.
NO_SEQ = -1
# version, read seq, delivered seq, skipping, gap end, rebuilt seq, personal mentions, broadcast base
_CELL = struct.Struct(">BqqBqqqq")
CELL_VERSION = 1
_unpack = _CELL.unpack
_make = tuple.__new__  # SessionState is a NamedTuple: its fields in order
_BIGINT = struct.Struct(">q")
COPY = "session_states"  # the copy's name in the markers' table


def session_cell(s: SessionState) -> bytes:
    """The copy's one cell of a SessionState."""
    return _CELL.pack(
        CELL_VERSION,
        s.read_conversation_seq,
        NO_SEQ if s.delivered_conversation_seq is None else s.delivered_conversation_seq,
        1 if s.skipping else 0,
        NO_SEQ if s.gap_end is None else s.gap_end,
        s.rebuilt_seq,
        s.personal_mentions,
        s.broadcast_base,
    )


def session_of_cell(cell: bytes) -> SessionState:
    """The SessionState of a copy's cell; ValueError for a cell this code did not write.
    (A login decodes thousands: the tuple made directly, ~1 us a cell.)"""
    if len(cell) != _CELL.size or cell[0] != CELL_VERSION:
        raise ValueError(f"a session_states cell of {len(cell)} bytes, version {cell[:1].hex()}: not this code's")
    _, read, delivered, skipping, gap_end, rebuilt, mentions, base = _unpack(cell)
    return _make(
        SessionState,
        (
            read,
            None if delivered == NO_SEQ else delivered,
            skipping == 1,
            None if gap_end == NO_SEQ else gap_end,
            rebuilt,
            mentions,
            base,
        ),
    )


def paired(
    row: tuple[PreparedStatement, tuple[Any, ...]], copy: PreparedStatement, copy_values: Sequence[str | bytes | int]
) -> Encoded:
    """A `user_states` write and its copy's as one run of a batch (batches.grouped keeps a
    run whole in one batch): one partition key, so one mutation. The row is bound by the
    driver, the copy's values serialized here (`copy_cells`)."""
    prepared, values = row
    bound = prepared.bind(values)
    body = b"".join(
        (statement(prepared.query_id, bound.values), prefix(copy.query_id, len(copy_values)), copy_cells(copy_values))
    )
    return Encoded(body, 2, bound.routing_key)


def copy_cells(values: Sequence[str | bytes | int]) -> bytes:
    """The values of a copy's statement as a statement carries them (batches.cell): a str as
    text, bytes as a blob, an int as a bigint (the stamp); the copy's columns have no other
    type (the driver's bind cost ~15 us a row, this ~2)."""
    return b"".join(
        cell(v.encode() if isinstance(v, str) else v if isinstance(v, bytes) else _BIGINT.pack(v)) for v in values
    )


def vouch(session: Session, keyspace: str, copy: str = COPY) -> None:
    """Mark the copy complete: every `user_states` row has its copy from now on (or, with
    `copy` the name of another table written with `user_states`, that table's rows:
    mailbox_floors.py)."""
    session.execute(f"INSERT INTO {keyspace}.copies_complete (copy) VALUES (%s)", (copy,))


def vouched(session: Session, keyspace: str, copy: str = COPY) -> bool:
    """Whether the copy is marked complete (`vouch`)."""
    return session.execute(f"SELECT copy FROM {keyspace}.copies_complete WHERE copy=%s", (copy,)).one() is not None
