"""Request bodies, query strings and WebSocket frames (SPEC section 6) as pydantic models.

Bodies and frames are strict and closed (`extra="forbid"`): a wrong type or an unknown
field is INVALID_ARGUMENT, never silently coerced. Query strings are text by nature,
so their numbers are parsed (lax) but still range-checked."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from domain.identity import MAX_ID_LENGTH
from domain.review import DECISIONS, TRIGGERS
from fanout.queries import MAX_PAGE
from fanout.strict_json import INT64_MAX

# Every integer the API takes fits SQLite's signed 64 bits; bodies are parsed by
# fanout.strict_json first, which also refuses NaN / Infinity and lone surrogates.
ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"  # no control characters (ids end mailbox keys)
ID_RULE = f"1 to {MAX_ID_LENGTH} characters, no control characters (U+0000..U+001F, U+007F) or surrogates"
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description=ID_RULE)]
# The seq of a message: 1 up to the conversation's latest (path {seq}, reply_to_seq).
MessageSeq = Annotated[
    int, Field(ge=1, le=INT64_MAX, description="a conversation_seq: 1 up to the conversation's latest conversation_seq")
]
Limit = Annotated[int, Field(ge=1, le=MAX_PAGE, description=f"page size, 1 to {MAX_PAGE}")]
# A conversation_seq a caller names: >= 0 (0: before the first message), at most the latest.
ReadSeq = Annotated[
    int,
    Field(
        ge=0, le=INT64_MAX, description="a conversation_seq: 0 (none) up to the conversation's latest conversation_seq"
    ),
]
AfterSeq = Annotated[
    int,
    Field(ge=0, le=INT64_MAX, description="messages after this conversation_seq; at most the latest conversation_seq"),
]
Cursor = Annotated[int, Field(ge=0, le=INT64_MAX, description="cursor: next_after of the previous page (0: start)")]
# A setting the server reads at start-up: openapi.py fills in the value it runs with.
TEXT_RULE = "1 to max_text_length characters (FANOUT_MAX_TEXT_LENGTH; the running value is maxLength)"
Text = Annotated[
    str, Field(min_length=1, description=TEXT_RULE, json_schema_extra={"x-max-length-param": "max_text_length"})
]
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False, description="a finite number > 0")]
Ratio = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False, description="a finite number in (0, 1]")]
SizeBucketName = Literal["small", "medium", "large"]
Decision = Literal[DECISIONS]  # type: ignore[valid-type]
Trigger = Literal[TRIGGERS]  # type: ignore[valid-type]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


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
    text: Text
    mentions: list[Id] = Field(default_factory=list)
    mention_all: bool = False
    reply_to_seq: MessageSeq | None = None
    announcement: bool = False
    client_msg_id: Id | None = Field(None, description="makes a retry idempotent: same seq, no duplicate")


MAX_BATCH = 100  # messages in one POST /v1/messages/batch (and the body stays within 1 MiB)


class BatchedMessage(SendMessage):
    conversation_id: Id


class SendBatch(Body):
    messages: list[BatchedMessage] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description=f"1 to {MAX_BATCH} sends, each what POST /v1/conversations/{{cid}}/messages takes plus its "
        "conversation_id; sent one after another, in this order, each on its own",
    )


# -- admin role ---------------------------------------------------------------


class OpenReview(Body):
    size_bucket: SizeBucketName
    trigger: Trigger = "manual"
    details: dict[str, Any] = Field(default_factory=dict)


class DecideReview(Body):
    decision: Decision
    read_diffusion_min_saving: PositiveFinite | None = Field(
        None, description="enable_mention_only: a finite number > 0 (members x (1 - alpha) a conversation must save)"
    )
    read_diffusion_max_active_ratio: Ratio | None = Field(
        None, description="enable_mention_only: a finite number in (0, 1] (alpha must be below it)"
    )
    note: Annotated[str, Field(max_length=2000)] = ""


class RollBackTier(Body):
    reason: Annotated[str, Field(min_length=1, max_length=1000)]


class PreviewQuery(Query):
    """The two parameters of enable_mention_only, as the decision would take them."""

    read_diffusion_min_saving: float = Field(
        description="a finite number > 0 (members x (1 - alpha) a conversation must save)"
    )
    read_diffusion_max_active_ratio: float = Field(description="a finite number in (0, 1] (alpha must be below it)")


class AlphaQuery(Query):
    """Thresholds to judge the enter criterion with (both or neither; neither: each tier's,
    else the latest review decided with them), as `fanout analyze alpha` takes them."""

    read_diffusion_min_saving: float | None = Field(None, description="a finite number > 0")
    read_diffusion_max_active_ratio: float | None = Field(None, description="a finite number in (0, 1]")


# -- user role ----------------------------------------------------------------


class MarkRead(Body):
    read_seq: ReadSeq


class FreshQuery(Query):
    """Read-your-writes: a read of the views may name the log position of a write."""

    min_position: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = Field(
        None,
        description=(
            "wait until the views have applied this log position (a write's X-Fanout-Position / position), "
            "at most FANOUT_FRESH_READ_TIMEOUT; then 503 UNAVAILABLE with Retry-After. "
            "The header X-Fanout-Min-Position does the same."
        ),
    )


class MailboxQuery(FreshQuery):
    after: Cursor = 0
    limit: Limit = 100


class HistoryQuery(FreshQuery):
    after_seq: AfterSeq = 0
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
    position: int = Field(description="the log position of this write (also X-Fanout-Position): a read's min_position")


class BatchSent(SendResult):
    status: Literal[200, 201] = Field(
        description="201 sent; 200 a retry of a client_msg_id already sent (no duplicate)"
    )


class BatchRefused(BaseModel):
    status: int = Field(description="the HTTP status this send alone would have had (400, 403, 404, 409, 429, 503)")
    error: str = Field(description="the wire code, e.g. NOT_A_MEMBER; as in an error body")
    message: str
    details: dict[str, Any]


class BatchResult(BaseModel):
    results: list[BatchSent | BatchRefused] = Field(description="one per message of the request, in its order")
    position: int = Field(
        description="the log position of the last accepted send (also X-Fanout-Position); with none accepted, "
        "the current log position"
    )


# -- WebSocket frames -----------------------------------------------------------


class AuthFrame(Body):
    type: Literal["AUTH"]
    token: str


class MarkReadFrame(Body):
    type: Literal["MARK_READ"]
    conversation_id: Id
    read_seq: ReadSeq


class PullHistoryFrame(Body):
    type: Literal["PULL_HISTORY"]
    conversation_id: Id
    after_seq: AfterSeq = 0
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
    coalesced: bool = Field(description="true: it changed nothing, no event was written; read_seq is the current one")
    position: int = Field(description="log position of this write (a read's min_position)")


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
    position: int = Field(description="log position of this write (a read's min_position)")


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
