"""Typed models of what the server sends: the WebSocket frames and the HTTP bodies of
docs/PROTOCOL.md. Unknown fields are ignored (a newer server may add some); the test
suite compares these field sets with the PROTOCOL examples and the server's OpenAPI, so a
drift on either side fails there."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

WritePolicy = Literal["always", "mention_only"]


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# -- the session list ------------------------------------------------------------------


class Session(Model):
    conversation_id: str
    write_policy: WritePolicy
    latest_conversation_seq: int
    read_conversation_seq: int
    unread_count: int
    unread_exact: bool
    mention_count: int
    last_activity_id: str | None
    preview: str | None
    # Absent: the mailbox is complete through latest (PROTOCOL, session fields).
    delivered_conversation_seq: int | None = None


class BigGroupHead(Model):
    conversation_id: str
    latest_conversation_seq: int
    last_activity_id: str | None
    preview: str | None
    unread_estimate: int


class Sessions(Model):
    """`GET /v1/me/sessions`: the items of SESSION_LIST_BATCH in one piece."""

    sessions: list[Session]
    big_group_heads: list[BigGroupHead]


# -- messages and the mailbox ------------------------------------------------------------


class Message(Model):
    conversation_id: str
    conversation_seq: int
    message_id: str
    sender: str
    text: str
    mentions: list[str]
    mention_all: bool
    reply_to_seq: int | None
    announcement: bool
    sent_at: float


class MailboxEntry(Model):
    cursor: int
    conversation_id: str
    conversation_seq: int
    mention: bool
    flags: int


class MailboxPage(Model):
    entries: list[MailboxEntry]
    next_after: int
    more: bool


# -- server frames -------------------------------------------------------------------------


class AuthOkFrame(Model):
    type: Literal["AUTH_OK"]
    user_id: str
    tenant: str


class SessionListBatchFrame(Sessions):
    type: Literal["SESSION_LIST_BATCH"]
    last: bool


class MessageFrame(Message):
    type: Literal["MESSAGE"]
    materialized: bool


class HeadFrame(Model):
    type: Literal["HEAD"]
    conversation_id: str
    latest_conversation_seq: int
    last_activity_id: str | None
    preview: str | None


class ReadOkFrame(Model):
    type: Literal["READ_OK"]
    conversation_id: str
    read_seq: int
    coalesced: bool
    position: int


class HistoryFrame(Model):
    type: Literal["HISTORY"]
    conversation_id: str
    messages: list[Message]
    latest_conversation_seq: int
    more: bool


class RebuildOkFrame(Model):
    type: Literal["REBUILD_OK"]
    conversation_id: str
    rebuilt_at_seq: int
    position: int


class ErrorFrame(Model):
    type: Literal["ERROR"]
    error: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


ServerFrame = (
    AuthOkFrame
    | SessionListBatchFrame
    | MessageFrame
    | HeadFrame
    | ReadOkFrame
    | HistoryFrame
    | RebuildOkFrame
    | ErrorFrame
)
SERVER_FRAMES: dict[str, type[Model]] = {
    "AUTH_OK": AuthOkFrame,
    "SESSION_LIST_BATCH": SessionListBatchFrame,
    "MESSAGE": MessageFrame,
    "HEAD": HeadFrame,
    "READ_OK": ReadOkFrame,
    "HISTORY": HistoryFrame,
    "REBUILD_OK": RebuildOkFrame,
    "ERROR": ErrorFrame,
}


def parse_frame(frame: dict[str, Any]) -> Model | None:
    """The typed frame; None for a frame type this client does not know (a newer server)."""
    model = SERVER_FRAMES.get(str(frame.get("type")))
    return None if model is None else model.model_validate(frame)


# -- client frames ---------------------------------------------------------------------------


class AuthRequest(Model):
    type: Literal["AUTH"] = "AUTH"
    token: str


class MarkReadRequest(Model):
    type: Literal["MARK_READ"] = "MARK_READ"
    conversation_id: str
    read_seq: int


class PullHistoryRequest(Model):
    type: Literal["PULL_HISTORY"] = "PULL_HISTORY"
    conversation_id: str
    after_seq: int = 0
    limit: int = 100


class RebuildRequest(Model):
    type: Literal["REBUILD"] = "REBUILD"
    conversation_id: str


ClientFrame = AuthRequest | MarkReadRequest | PullHistoryRequest | RebuildRequest


# -- HTTP bodies of the service role -----------------------------------------------------------


class ErrorBody(Model):
    error: str
    message: str
    details: dict[str, Any]


class ConversationCreated(Model):
    conversation_id: str
    title: str | None
    member_count: int
    position: int


class MembersAdded(Model):
    added: int
    member_count: int
    position: int


class MemberRemoved(Model):
    member_count: int
    position: int


class SendResult(Model):
    conversation_seq: int
    message_id: str
    write_policy: WritePolicy
    position: int


class BatchSent(SendResult):
    status: Literal[200, 201]


class BatchRefused(Model):
    status: int
    error: str
    message: str
    details: dict[str, Any]


class BatchResult(Model):
    results: list[BatchSent | BatchRefused]
    position: int


class ConversationHead(Model):
    conversation_id: str
    title: str | None
    latest_conversation_seq: int
    last_activity_id: str | None
    preview: str | None
    member_count: int
    size_bucket: str
    write_policy: WritePolicy
