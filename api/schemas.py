"""Request bodies, query strings and WebSocket frames (SPEC section 6) as pydantic models.

Bodies and frames are strict and closed (`extra="forbid"`): a wrong type or an unknown
field is INVALID_ARGUMENT, never silently coerced. Query strings are text by nature,
so their numbers are parsed (lax) but still range-checked."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from domain.tier import DECISIONS, TRIGGERS
from fanout.queries import MAX_PAGE

Id = Annotated[str, Field(min_length=1, max_length=128)]
Seq = Annotated[int, Field(ge=0)]
Limit = Annotated[int, Field(ge=1, le=MAX_PAGE)]
SizeBucketName = Literal["small", "medium", "large"]
Decision = Literal[DECISIONS]  # type: ignore[valid-type]
Trigger = Literal[TRIGGERS]  # type: ignore[valid-type]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- service role -------------------------------------------------------------


class CreateConversation(Body):
    conversation_id: Id | None = Field(None, description="generated when absent")
    title: Annotated[str, Field(max_length=256)] = ""
    members: list[Id] = Field(default_factory=list, description="initial members")


class AddMembers(Body):
    user_ids: list[Id] = Field(description="bulk join; members already in are ignored")


class SendMessage(Body):
    sender: Id
    text: str = Field(description="at most max_text_length characters")
    mentions: list[Id] = Field(default_factory=list)
    mention_all: bool = False
    reply_to_seq: Annotated[int, Field(ge=1)] | None = None
    announcement: bool = False
    client_msg_id: Id | None = Field(None, description="makes a retry idempotent: same seq, no duplicate")


# -- admin role ---------------------------------------------------------------


class OpenReview(Body):
    size_bucket: SizeBucketName
    trigger: Trigger = "manual"
    details: dict[str, Any] = Field(default_factory=dict)


class DecideReview(Body):
    decision: Decision
    read_diffusion_min_saving: Annotated[float, Field(gt=0)] | None = None
    read_diffusion_max_active_ratio: Annotated[float, Field(gt=0, le=1)] | None = None
    note: Annotated[str, Field(max_length=2000)] = ""


class RollBackTier(Body):
    reason: Annotated[str, Field(min_length=1, max_length=1000)]


# -- user role ----------------------------------------------------------------


class MarkRead(Body):
    read_seq: Seq


class MailboxQuery(Query):
    after: Seq = Field(0, description="cursor: next_after of the previous page")
    limit: Limit = 100


class HistoryQuery(Query):
    after_seq: Seq = 0
    limit: Limit = 100


# -- responses (documentation) --------------------------------------------------


class ErrorBody(BaseModel):
    error: str = Field(description="the wire code, e.g. NOT_FOUND")
    message: str
    details: dict[str, Any]


class SendResult(BaseModel):
    conversation_seq: int
    message_id: str
    write_policy: Literal["always", "mention_only"]


# -- WebSocket frames -----------------------------------------------------------


class AuthFrame(Body):
    type: Literal["AUTH"]
    token: str


class MarkReadFrame(Body):
    type: Literal["MARK_READ"]
    conversation_id: Id
    read_seq: Seq


class PullHistoryFrame(Body):
    type: Literal["PULL_HISTORY"]
    conversation_id: Id
    after_seq: Seq = 0
    limit: Limit = 100


class RebuildFrame(Body):
    type: Literal["REBUILD"]
    conversation_id: Id


ClientFrame = Annotated[MarkReadFrame | PullHistoryFrame | RebuildFrame, Field(discriminator="type")]
CLIENT_FRAME: TypeAdapter[MarkReadFrame | PullHistoryFrame | RebuildFrame] = TypeAdapter(ClientFrame)


class AuthOkFrame(BaseModel):
    type: Literal["AUTH_OK"]
    user_id: str
    tenant: str


class SessionListBatchFrame(BaseModel):
    type: Literal["SESSION_LIST_BATCH"]
    sessions: list[dict[str, Any]]
    big_group_heads: list[dict[str, Any]]
    last: bool


class MessageFrame(BaseModel):
    type: Literal["MESSAGE"]
    conversation_id: str
    conversation_seq: int
    message_id: str
    sender: str
    text: str
    materialized: bool = Field(description="false: this member has no mailbox entry for it (mention_only)")


class HeadFrame(BaseModel):
    type: Literal["HEAD"]
    conversation_id: str
    latest_conversation_seq: int
    last_activity_id: str | None
    preview: str | None


class ReadOkFrame(BaseModel):
    type: Literal["READ_OK"]
    conversation_id: str
    read_seq: int


class HistoryFrame(BaseModel):
    type: Literal["HISTORY"]
    conversation_id: str
    messages: list[dict[str, Any]]
    latest_conversation_seq: int
    more: bool


class RebuildOkFrame(BaseModel):
    type: Literal["REBUILD_OK"]
    conversation_id: str
    rebuilt_at_seq: int


class ErrorFrame(BaseModel):
    type: Literal["ERROR"]
    error: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


CLIENT_FRAMES: list[type[BaseModel]] = [AuthFrame, MarkReadFrame, PullHistoryFrame, RebuildFrame]
SERVER_FRAMES: list[type[BaseModel]] = [
    AuthOkFrame,
    SessionListBatchFrame,
    MessageFrame,
    HeadFrame,
    ReadOkFrame,
    HistoryFrame,
    RebuildOkFrame,
    ErrorFrame,
]
