"""The rows the views hold, typed once. The delivery projection writes them as dicts
(`ViewWriter.put_head`, `put_message`, `put_delivery`, `put_states`), built as these
TypedDicts (plain dicts at run time, their keys and types checked by mypy); every backend
(adapters/sqlite/, adapters/cassandra/, adapters/memory.py) derives its column lists from
these types and answers with the dicts built here, so the three stop spelling them
separately and the wire shape (tests/e2e, tests/contract) is defined in one place.

* HeadRow: a conversation's head, keyed (tenant, conversation_id).
* MessageRow: a message body, keyed (tenant, conversation_id, conversation_seq).
* DeliveryRecord: a message's delivery record, same key, as the log says it;
  DeliveryRow: the stored row, with the runtime facts a rebuild cannot recompute
  (DELIVERY_RUNTIME).
* The member rows are UserConversationState (STATE_COLUMNS); a mailbox entry is
  projections.ports.MailboxEntry; a login's session item is SessionItem, the pair
  (SessionHead, SessionState) of projections/state.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, TypedDict

from projections.state import SessionHead as SessionHead
from projections.state import SessionItem as SessionItem
from projections.state import SessionState as SessionState
from projections.state import UserConversationState


def columns(row: type) -> tuple[str, ...]:
    """The column names of a row type (a TypedDict here, or a dataclass: UserConversationState),
    in its declared order."""
    if is_dataclass(row):
        return tuple(f.name for f in fields(row))
    return tuple(row.__annotations__)


class HeadRow(TypedDict):
    """A conversation's head (ConversationHead): the columns after its key."""

    aggregate_id: str
    title: str | None
    latest_conversation_seq: int
    last_activity_id: str | None
    last_activity_at: float | None
    preview: str | None
    member_count: int
    size_bucket: str
    write_policy: str
    broadcasts: int
    created_at: float | None
    position: int  # the log position of the last event applied to the conversation


class MessageRow(TypedDict):
    """A message: the columns after the tenant. The views answer it without `pos`."""

    conversation_id: str
    conversation_seq: int
    message_id: str
    sender: str
    text: str
    mentions: list[str]  # JSON text in the SQLite and Cassandra tables
    mention_all: bool
    reply_to_seq: int | None
    announcement: bool
    sent_at: float
    pos: int  # the log position of the send


class DeliveryRecord(TypedDict):
    """A message's delivery record as the log says it (what `put_delivery` takes)."""

    message_id: str
    write_policy: str
    member_count: int
    mailbox_entries: int
    shards: int
    body_bytes: int
    pos: int


class DeliveryRow(DeliveryRecord):
    """A message's delivery record as stored: the columns after its key."""

    # runtime facts, not derived from the log (DELIVERY_RUNTIME)
    online_pushes: int | None
    materialized_at: float | None


HEAD_KEY = ("tenant", "conversation_id")
HEAD_COLUMNS = columns(HeadRow)
MESSAGE_KEY = ("tenant", "conversation_id", "conversation_seq")
MESSAGE_COLUMNS = columns(MessageRow)  # the table's columns after the tenant
MESSAGE_FIELDS = tuple(c for c in MESSAGE_COLUMNS if c != "pos")  # a message as the views answer it
DELIVERY_KEY = ("tenant", "conversation_id", "conversation_seq")
# What a rebuild cannot recompute (when and to how many online devices the message was first
# pushed): ignored by verify, carried over by a rebuild's switch.
DELIVERY_RUNTIME = ("materialized_at", "online_pushes")
DELIVERY_RECORD = columns(DeliveryRecord)  # what put_delivery gets
DELIVERY_COLUMNS = columns(DeliveryRow)
STATE_COLUMNS = columns(UserConversationState)  # UserConversationState.row() order


# -- writing: a row's cells in column order ------------------------------------------------


def head_cells(head: Mapping[str, Any]) -> tuple[Any, ...]:
    """The HEAD_COLUMNS of a head dict (the aggregate id as text)."""
    return tuple(str(head[c]) if c == "aggregate_id" and head.get(c) is not None else head.get(c) for c in HEAD_COLUMNS)


def message_cells(m: Mapping[str, Any]) -> tuple[Any, ...]:
    """The MESSAGE_COLUMNS of a message dict as the SQL and CQL tables store them (the
    mentions as JSON text, the flags as bools: SQLite stores them as 0/1)."""
    return tuple(_stored(c, m[c]) for c in MESSAGE_COLUMNS)


def _stored(column: str, value: Any) -> Any:
    if column == "mentions":
        return json.dumps(value)
    if column in ("mention_all", "announcement"):
        return bool(value)
    return value


def delivery_cells(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """The DELIVERY_RECORD columns of a delivery record dict."""
    return tuple(record[c] for c in DELIVERY_RECORD)


# -- reading: the dicts the views answer ---------------------------------------------------


def head_dict(r: Mapping[str, Any]) -> dict[str, Any]:
    """A stored head as the views answer it: its key and HEAD_COLUMNS."""
    return {c: r[c] for c in (*HEAD_KEY, *HEAD_COLUMNS)}


def message_dict(r: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as the views answer it (MESSAGE_FIELDS: no tenant, no log position),
    the mentions a list (decoded when stored as JSON text), the flags bools."""
    out = {c: r[c] for c in MESSAGE_FIELDS}
    mentions = out["mentions"]
    out["mentions"] = json.loads(mentions) if isinstance(mentions, str) else list(mentions)
    out["mention_all"] = bool(out["mention_all"])
    out["announcement"] = bool(out["announcement"])
    return out


def delivery_dict(r: Mapping[str, Any]) -> dict[str, Any]:
    """A stored delivery record as the views answer it: its key and DELIVERY_COLUMNS."""
    return {c: r[c] for c in (*DELIVERY_KEY, *DELIVERY_COLUMNS)}
