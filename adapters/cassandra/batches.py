"""UNLOGGED batches whose statements are serialized here, once, not by the driver per row.

The driver serializes a batch in `BatchMessage.send_body`: for every statement a kind byte,
the query id, the value count and each value with its length, about twenty writes a row (3.6
us of client CPU a mailbox row measured, on top of 3-4 us building the rows and the batch). A
message's rows of one mailbox partition differ only in the member: their statements are one
template around the member's cell, so `Encoded` holds a run of them already joined (a C-level
`bytes.join` for ~100 rows, `joined`), and a batch is sent as its parts concatenated.

How it reaches the wire: a batch built by `grouped` carries its statements as a
`PackedStatements` (its parts and its row count) where the driver keeps its list of
(prepared?, query id, values); the session's protocol handler (`install`, done by
connect.open_cluster on every session) writes such a batch's body as the head (type, count), the
parts, then the tail the driver writes for an empty batch (consistency, flags, keyspace). Any
other message is encoded by the driver as before. `Session.client_protocol_handler` is the
driver's documented hook for a custom handler; the rest of a request (routing, retries,
re-preparing an unknown id, timeouts) is the driver's own. docs/adr/0039-batches-serialized-once.md.
"""

from __future__ import annotations

import io
import struct
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from cassandra.protocol import BatchMessage
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement

_SHORT = struct.Struct(">H")
_INT = struct.Struct(">i")
_HEAD = struct.Struct(">BH")  # batch type, statement count
_NULL = _INT.pack(-1)
_UNSET = _INT.pack(-2)
MAX_STATEMENTS = 0xFFFF  # the protocol's limit of a batch


class Encoded(NamedTuple):
    """`rows` statements serialized as a batch carries them (`statement`, `joined`): a run of
    one partition's, or a small message's of several (routed as a batch by the first's)."""

    body: bytes
    rows: int
    key: bytes | None  # the routing key of its (first) statement's partition (token-aware routing)


Row = tuple[PreparedStatement, tuple[Any, ...]] | Encoded


def cell(value: Any) -> bytes:
    """A serialized value as a statement carries it: its length then its bytes (null: length
    -1, unset: -2, as the driver's write_value)."""
    if value is None:
        return _NULL
    if value is UNSET_VALUE:
        return _UNSET
    out: bytes = _INT.pack(len(value)) + value
    return out


def routing_key(key: tuple[bytes, ...]) -> bytes:
    """The routing key of a partition key (the driver's encoding of a composite key)."""
    if len(key) == 1:
        return key[0]
    return b"".join(map(key_component, key))


def key_component(value: bytes) -> bytes:
    """One column's part of a composite partition key's routing key."""
    return _SHORT.pack(len(value)) + value + b"\x00"


def prefix(query_id: bytes, count: int) -> bytes:
    """What a prepared statement of a batch starts with: kind 1 (prepared), its id, its value
    count; its values' cells follow."""
    return b"".join((b"\x01", _SHORT.pack(len(query_id)), query_id, _SHORT.pack(count)))


def statement(query_id: bytes, values: Sequence[Any]) -> bytes:
    """One prepared statement of a batch with its values."""
    return b"".join([prefix(query_id, len(values)), *map(cell, values)])


def joined(head: bytes, tail: bytes, cells: Sequence[bytes]) -> bytes:
    """The statements `head + c + tail` for each of `cells` (values already `cell`-encoded):
    statements that differ in one value, `head` the prefix and the cells before it, `tail` the
    cells after it, in one `bytes.join`."""
    return b"".join((head, (tail + head).join(cells), tail))


class Binder:
    """A prepared statement's values serialized as the driver's `bind` serializes them (each
    column's type's `serialize`; None null, UNSET_VALUE unset) and its routing key as the
    driver computes it, without the BoundStatement `bind` builds (and its per-value column
    descriptor and encryption lookups): 2-3x less client CPU a row (ADR-0053)."""

    __slots__ = ("__weakref__", "head", "key_indexes", "names", "protocol", "types")

    def __init__(self, prepared: PreparedStatement) -> None:
        if prepared.column_encryption_policy is not None:
            raise ValueError("a column encryption policy is set: bind such statements with the driver")
        meta = prepared.column_metadata
        self.head = prefix(prepared.query_id, len(meta))
        self.types = tuple(c.type for c in meta)
        self.names = tuple(c.name for c in meta)
        self.key_indexes = tuple(prepared.routing_key_indexes or ())
        self.protocol = prepared.protocol_version

    def encode(self, values: Sequence[Any]) -> Encoded:
        """The statement with its values, as a batch carries it; routed by its partition."""
        if len(values) != len(self.types):
            raise ValueError(f"{len(values)} values for a statement of {len(self.types)} ({self.names})")
        cells: list[bytes] = []
        append, protocol = cells.append, self.protocol
        for value, kind in zip(values, self.types, strict=True):
            if value is None:
                append(_NULL)
            elif value is UNSET_VALUE:
                append(_UNSET)
            else:
                try:
                    b = kind.serialize(value, protocol)
                except (TypeError, struct.error) as exc:
                    name = self.names[len(cells)]
                    raise TypeError(
                        f"column {name!r} ({kind.typename}) given a {type(value).__name__}: {exc}"
                    ) from None
                append(_INT.pack(len(b)) + b)
        keys = [cells[i][_INT.size :] for i in self.key_indexes]
        if any(values[i] is None or values[i] is UNSET_VALUE for i in self.key_indexes):
            raise ValueError(f"no value for a partition key column of {self.names}")
        # no partition key among the values: no routing key, routed as the driver would (round-robin)
        return Encoded(b"".join([self.head, *cells]), 1, routing_key(tuple(keys)) if keys else None)


_BINDERS: weakref.WeakKeyDictionary[PreparedStatement, Binder] = weakref.WeakKeyDictionary()


def bound(prepared: PreparedStatement, values: Sequence[Any]) -> Encoded:
    """`values` bound to `prepared` and serialized (its Binder, made once a statement)."""
    binder = _BINDERS.get(prepared)
    if binder is None:
        binder = _BINDERS[prepared] = Binder(prepared)
    return binder.encode(values)


class PackedStatements:
    """A batch's statements as serialized parts (what `grouped` puts where the driver keeps
    its list of statements; the session's protocol handler writes them, `install`)."""

    __slots__ = ("count", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.count = 0

    def __len__(self) -> int:
        return self.count


class _PackedBatchMessage(BatchMessage):  # type: ignore[misc]  # the driver is untyped
    """A BatchMessage whose statements are PackedStatements: head, parts, then the tail the
    driver writes after the statements of any batch."""

    def __init__(self, message: BatchMessage) -> None:
        super().__init__(
            message.batch_type,
            message.queries,
            message.consistency_level,
            message.serial_consistency_level,
            message.timestamp,
            message.keyspace,
        )
        self.custom_payload = message.custom_payload
        self.tracing = message.tracing

    def send_body(self, f: Any, protocol_version: int, protocol_features: Any = None) -> None:
        packed: PackedStatements = self.queries
        f.write(_HEAD.pack(self.batch_type.value, packed.count))
        for part in packed.parts:
            f.write(part)
        empty = BatchMessage(
            self.batch_type, (), self.consistency_level, self.serial_consistency_level, self.timestamp, self.keyspace
        )
        rest = io.BytesIO()
        empty.send_body(rest, protocol_version, protocol_features)
        f.write(rest.getbuffer()[_HEAD.size :])


def install(session: Any) -> None:
    """Make the session's protocol handler write PackedStatements batches (idempotent)."""
    handler = session.client_protocol_handler
    if getattr(handler, "writes_packed_batches", False):
        return

    class PackedBatches(handler):  # type: ignore[misc, valid-type]
        writes_packed_batches = True

        @classmethod
        def encode_message(cls, msg: Any, *args: Any, **kwargs: Any) -> Any:
            if type(msg) is BatchMessage and type(msg.queries) is PackedStatements:
                msg = _PackedBatchMessage(msg)
            return super().encode_message(msg, *args, **kwargs)

    session.client_protocol_handler = PackedBatches


def grouped(rows: Iterable[Row], size: int, keyspace: str) -> Iterator[tuple[BatchStatement, None]]:
    """UNLOGGED batches of about `size` rows (grouped writes, not a round trip each), routed
    by their first row's partition. A prepared statement's values are serialized here
    (`bound`, ADR-0053); an Encoded run goes as it is, whole, in a batch it does not push
    past `size` (a large message's run of one partition is a batch of its own, one mutation;
    makers keep runs at most `size` long). Execute them on a session `install`ed."""
    pending: list[Encoded] = []
    count = 0
    for row in rows:
        if not isinstance(row, Encoded):
            row = bound(*row)
        if count and count + row.rows > size:  # a run's partition stays in one batch
            yield batch_of(pending, keyspace), None
            pending, count = [], 0
        pending.append(row)
        count += row.rows
        if count >= size:
            yield batch_of(pending, keyspace), None
            pending, count = [], 0
    if count:
        yield batch_of(pending, keyspace), None


def batch_of(rows: Sequence[Encoded], keyspace: str) -> BatchStatement:
    """One UNLOGGED batch of `rows`, routed by the first's partition (execute it on a session
    `install`ed)."""
    batch, packed = _batch()
    batch.routing_key, batch.keyspace = rows[0].key, keyspace
    packed.parts.extend(r.body for r in rows)
    packed.count = sum(r.rows for r in rows)
    if packed.count > MAX_STATEMENTS:
        raise ValueError(f"a batch of {packed.count} statements: the protocol's limit is {MAX_STATEMENTS}")
    return batch


def _batch() -> tuple[BatchStatement, PackedStatements]:
    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
    packed = PackedStatements()
    batch._statements_and_parameters = packed  # the driver hands it to BatchMessage as `queries`
    return batch, packed
