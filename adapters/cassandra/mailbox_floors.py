"""A user's mailbox floor (ADR-0045): a log position below every mailbox entry the user has,
so a cursor read from 0 starts at the user's first conversation, not at the tenant's first hour.

The mailbox is partitioned by the hour (ADR-0038) and a cursor read walks the tenant's hours
from the cursor on, READ_WINDOW hours a request: from cursor 0 that is every hour of the
tenant, although a user who joined last week has entries in none of the older ones (a year of
history: ~270 requests and ~2 s of Cassandra's CPU for one empty page).

Every entry of a user is the ref of a message sent after the user joined its conversation, and
the join wrote the user's state row; the unit of work that applied the join applied events
above the position its partition's views stood at before it (the host's `above`). So the
lowest `above` of any unit that wrote one of the user's state rows is below every entry of
theirs. The table `mailbox_floors ((tenant, user_id)) above bigint` keeps it: each unit that
puts a state row writes its `above` with the row, in the same run of the same batch (one
partition key with `user_states`, so one mutation), stamped `floor_stamp(above)`, which is
higher the lower `above` is: Cassandra keeps the cell with the highest stamp, so the lowest
`above` ever written wins, whatever order units (or a replay, or a stale writer) write in.
A read then starts at max(cursor, floor).

A floor row is absent for a user no unit has put a state row of: with the floors vouched
complete (every state row ever put wrote its floor: `COPY`, marked as session_states.py's
copy is, when the table is created beside an empty `user_states`), such a user has no entry
at or below the views' position, and a read answers an empty page without walking the hours.
A keyspace whose `user_states` had rows before this table existed is not vouched (no rebuild
writes floors either, as the merge restamps rows): its reads walk the hours as before."""

from __future__ import annotations

import struct

from adapters.cassandra.batches import Encoded, routing_key, statement

COPY = "mailbox_floors"  # its name in the markers' table (copies_complete)
TOP = 1 << 62  # floor_stamp(above) = TOP - above: above any stamp (stamps.py: BASE 2**52 + 4 a position)
_BIGINT = struct.Struct(">q")

UPDATE = "UPDATE {ks}.mailbox_floors USING TIMESTAMP ? SET above = ? WHERE tenant = ? AND user_id = ?"
SELECT = "SELECT above FROM {ks}.mailbox_floors WHERE tenant = ? AND user_id = ?"


def floor_stamp(above: int) -> int:
    """The write timestamp of a floor: the lower the floor, the higher its stamp."""
    if not 0 <= above < TOP:
        raise ValueError(f"a floor is a log position >= 0, got {above}")
    return TOP - above


def floor_statement(query_id: bytes, tenant: str, user_id: str, above: int) -> bytes:
    """The UPDATE of one floor as a batch carries it (values serialized here): stamp, above,
    tenant, user."""
    return statement(
        query_id, (_BIGINT.pack(floor_stamp(above)), _BIGINT.pack(above), tenant.encode(), user_id.encode())
    )


def floor_row(query_id: bytes, tenant: str, user_id: str, above: int) -> Encoded:
    """One floor as a batch's run of its own (routed by its partition, (tenant, user_id))."""
    key = routing_key((tenant.encode(), user_id.encode()))
    return Encoded(floor_statement(query_id, tenant, user_id, above), 1, key)
