"""The session heads' copy (ADR-0042): what a login shows of each head, in a partition per
(tenant, SessionHeadShard) of the `session_heads` table (DDL in schema.py), so a login reads
a user's heads from at most SESSION_HEAD_SHARDS partitions. Here: a conversation's shard, and
the copy's rows of a unit of work serialized as a batch carries them (ADR-0039's way: the
driver's bind cost ~20 us a row, this ~5), each with its head's stamp. The commit writes them
after the heads (adapters/cassandra/views.py); the login reads them (login.py `LoginReads.heads`)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from adapters.cassandra.batches import Encoded, prefix, routing_key
from projections.rows import HEAD_COLUMNS
from projections.state import SessionHead

# The session heads' partitions per tenant: a login of a user in 5,000 conversations reads at
# most this many; a tenant of 10M conversations has ~150k rows in each. Changing it moves every
# row: the keyspace is rebuilt (`fanout rebuild heads`).
SESSION_HEAD_SHARDS = 64
SESSION_HEAD_VALUES = 10  # the values of an insert: tenant, shard, the SessionHead columns, the stamp

_SESSION_HEAD = tuple(HEAD_COLUMNS.index(c) for c in SessionHead._fields[1:])  # a head's cells, after its id
_BIGINT, _INT, _DOUBLE = struct.Struct(">q"), struct.Struct(">i"), struct.Struct(">d")
_NULL = _INT.pack(-1)
_LONG = _INT.pack(8)  # a bigint's or a double's length
_FOUR = _INT.pack(4)  # an int's length


def session_head_shard(conversation_id: str) -> int:
    """The session_heads partition of a conversation (crc32: stable across processes)."""
    return zlib.crc32(conversation_id.encode()) % SESSION_HEAD_SHARDS


def session_head_rows(
    heads: Iterable[tuple[tuple[str, str], tuple[Sequence[Any], int]]], statement_id: bytes, ts_of: Callable[..., int]
) -> list[Encoded]:
    """The copy of each ((tenant, conversation id), (its HEAD_COLUMNS cells, its size)) a unit
    of work put, as statements of `statement_id` (the `session_head` insert), in partition
    order so a batch holds few partitions; each stamped with `ts_of(tenant, conversation id)`."""
    head = prefix(statement_id, SESSION_HEAD_VALUES)
    rows = []
    for (t, c), (cells, _) in heads:
        tenant, shard = t.encode(), session_head_shard(c)
        values = session_head_cells(tenant, shard, c, [cells[i] for i in _SESSION_HEAD], ts_of(t, c))
        key = routing_key((tenant, _INT.pack(shard)))
        rows.append(((t, shard, c), Encoded(head + values, 1, key)))
    rows.sort(key=lambda r: r[0])
    return [r for _, r in rows]


def _text(v: str | None) -> bytes:
    if v is None:
        return _NULL
    b = v.encode()
    return _INT.pack(len(b)) + b


def _bigint(v: int | None) -> bytes:
    return _NULL if v is None else _LONG + _BIGINT.pack(v)


def session_head_cells(tenant: bytes, shard: int, conversation_id: str, head: Sequence[Any], ts: int) -> bytes:
    """The SESSION_HEAD_VALUES values of a `session_head` insert as a statement carries them
    (each its length, then the driver's encoding of its column's type; batches.cell): the
    tenant, shard, conversation id, then `head`, the SessionHead columns after the
    conversation id (write policy, latest seq, broadcasts, last activity id and time,
    preview), then the write stamp."""
    policy, latest, broadcasts, activity_id, activity_at, preview = head
    return b"".join(
        (
            _INT.pack(len(tenant)),
            tenant,
            _FOUR,
            _INT.pack(shard),
            _text(conversation_id),
            _text(policy),
            _bigint(latest),
            _bigint(broadcasts),
            _text(activity_id),
            _NULL if activity_at is None else _LONG + _DOUBLE.pack(activity_at),
            _text(preview),
            _LONG + _BIGINT.pack(ts),
        )
    )
