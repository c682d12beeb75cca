"""The client rule of docs/PROTOCOL.md as a sans-I/O state machine: frames and HTTP answers
in, actions out (send this frame, read the mailbox after this cursor, save these states,
deliver this message, resolve this request), no socket, clock or sleep inside.

1. AUTH, the session list up to `last: true`; 2. the mailbox from the stored cursor until
`more` is false; 3. PULL_HISTORY of exactly the seq ranges not held; 4. live MESSAGE / HEAD
frames, a seq ahead of what is held opening a gap that is pulled at once. Replies to client
frames come in the order the frames were sent, so requests wait in one FIFO."""

from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fanout_client.backoff import retry_delay
from fanout_client.errors import (
    Action,
    ApiError,
    FanoutClientError,
    ProtocolViolation,
    StateMismatch,
    action_for_error,
    api_error,
)
from fanout_client.models import (
    AuthOkFrame,
    ErrorFrame,
    HeadFrame,
    HistoryFrame,
    MailboxPage,
    MessageFrame,
    Model,
    ReadOkFrame,
    RebuildOkFrame,
    SessionListBatchFrame,
    parse_frame,
)
from fanout_client.state import ClientState, ConversationState

MAX_PULL = 1000  # PULL_HISTORY's largest page
MAX_RETRIES = 5  # a request refused this many times with a retry hint fails


class Phase(enum.Enum):
    AUTH = "waiting for AUTH_OK"
    LIST = "reading the session list"
    MAILBOX = "reading the mailbox"
    LIVE = "live"


# -- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    frame: dict[str, Any]


@dataclass(frozen=True)
class ReadMailbox:
    after: int


@dataclass(frozen=True)
class Save:
    """Persist these conversations and the cursor in one transaction (held ranges and the
    cursor that passed them must land together), and forget `removed`."""

    tenant: str | None
    user_id: str | None
    cursor: int
    conversations: tuple[ConversationState, ...]
    removed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Deliver:
    """A message body not held before, for the app."""

    message: Any  # models.Message or MessageFrame


@dataclass(frozen=True)
class Resolve:
    ticket: int
    result: Model | ApiError


@dataclass(frozen=True)
class RetryLater:
    """Ask the core to send `request` again (retry()) after `delay` seconds."""

    delay: float
    request: Request


Effect = Send | ReadMailbox | Save | Deliver | Resolve | RetryLater


@dataclass
class Request:
    frame: dict[str, Any]
    ticket: int | None = None  # an app's request (MARK_READ, REBUILD); None for the core's pulls
    attempts: int = 0

    @property
    def kind(self) -> str:
        return str(self.frame["type"])

    @property
    def conversation_id(self) -> str:
        return str(self.frame["conversation_id"])


@dataclass
class SyncCore:
    state: ClientState
    rng: random.Random = field(default_factory=random.Random)
    phase: Phase = Phase.AUTH
    refused: ApiError | None = None  # the ERROR frame that refused AUTH (then the server closes)
    failures: dict[str, ApiError] = field(default_factory=dict)  # pulls given up, per conversation
    _inflight: deque[Request] = field(default_factory=deque)
    _waiting: list[Request] = field(default_factory=list)  # app requests made before LIVE
    _pulling: dict[str, tuple[int, int]] = field(default_factory=dict)
    _stalled: dict[str, int] = field(default_factory=dict)  # gap not served by the views up to this latest
    _listed: set[str] = field(default_factory=set)
    _dirty: set[str] = field(default_factory=set)
    _tickets: int = 0

    # -- inputs from the transport ---------------------------------------------------------

    def connect(self, token: str) -> list[Effect]:
        """A new connection: everything in the air on the last one is forgotten (pulls are
        recomputed from the gaps; the app's unanswered requests are sent again, they are
        idempotent)."""
        self._waiting = [r for r in self._inflight if r.ticket is not None] + self._waiting
        self._inflight.clear()
        self._pulling.clear()
        self._stalled.clear()
        self._listed.clear()
        self.failures.clear()
        self.phase, self.refused = Phase.AUTH, None
        return [Send({"type": "AUTH", "token": token})]

    @property
    def caught_up(self) -> bool:
        return (
            self.phase is Phase.LIVE
            and not self._pulling
            and not any(c.gaps() for c in self.state.conversations.values())
        )

    def receive(self, raw: dict[str, Any]) -> list[Effect]:
        try:
            frame = parse_frame(raw)
        except ValueError as exc:
            raise ProtocolViolation(f"a {raw.get('type')} frame that does not parse: {exc}") from None
        if frame is None:
            return []  # a frame type of a newer server
        if isinstance(frame, ErrorFrame):
            return self._error(api_error(frame.error, frame.message, frame.details))
        if self.phase is Phase.AUTH:
            if not isinstance(frame, AuthOkFrame):
                raise ProtocolViolation(f"{raw.get('type')} before AUTH_OK")
            return self._auth_ok(frame)
        if isinstance(frame, SessionListBatchFrame):
            return self._session_list(frame)
        if isinstance(frame, MessageFrame):
            return self._message(frame)
        if isinstance(frame, HeadFrame):
            c = self._known(frame.conversation_id, frame.latest_conversation_seq)
            c.apply_head(frame)
            return self._after_change(c)
        if isinstance(frame, HistoryFrame | ReadOkFrame | RebuildOkFrame):
            return self._reply(frame)
        raise ProtocolViolation(f"unexpected {raw.get('type')} frame in phase {self.phase.name}")

    def mailbox_page(self, raw: dict[str, Any]) -> list[Effect]:
        if self.phase is not Phase.MAILBOX:
            return []  # a page of a connection that is gone
        page = MailboxPage.model_validate(raw)
        for e in page.entries:
            c = self._known(e.conversation_id, e.conversation_seq)
            c.apply_entry(e)
            self._dirty.add(c.conversation_id)
        self.state.cursor = max(self.state.cursor, page.next_after)
        if page.more:
            return [self._save(), ReadMailbox(self.state.cursor)]
        self.phase = Phase.LIVE
        effects: list[Effect] = [self._save()]
        for request in self._waiting:
            effects += self._send(request)
        self._waiting = []
        for cid in sorted(self.state.conversations):
            effects += self._pull(self.state.conversations[cid])
        return effects

    # -- the app's requests --------------------------------------------------------------------

    def mark_read(self, conversation_id: str, read_seq: int | None = None) -> tuple[int, list[Effect]]:
        """MARK_READ to `read_seq`, or to the latest seq held."""
        c = self.state.conversations.get(conversation_id)
        if c is None:
            raise FanoutClientError(f"{conversation_id} is not in this user's session list")
        seq = c.held.highest() if read_seq is None else read_seq
        if seq is None:
            raise FanoutClientError(f"nothing of {conversation_id} is held yet: give the seq to mark read")
        return self._request({"type": "MARK_READ", "conversation_id": conversation_id, "read_seq": seq})

    def rebuild(self, conversation_id: str) -> tuple[int, list[Effect]]:
        return self._request({"type": "REBUILD", "conversation_id": conversation_id})

    def retry(self, request: Request) -> list[Effect]:
        if request.ticket is None and (request.conversation_id not in self._pulling or self.phase is not Phase.LIVE):
            return []  # a pull of a connection that is gone: the next sync recomputes it
        return self._send(request)

    # -- frames ----------------------------------------------------------------------------------

    def _auth_ok(self, frame: AuthOkFrame) -> list[Effect]:
        s = self.state
        if s.user_id is not None and (s.user_id, s.tenant) != (frame.user_id, frame.tenant):
            raise StateMismatch(
                f"the stored state is {s.tenant}/{s.user_id}'s, the token {frame.tenant}/{frame.user_id}'s"
            )
        s.user_id, s.tenant = frame.user_id, frame.tenant
        self.phase = Phase.LIST
        return []

    def _session_list(self, frame: SessionListBatchFrame) -> list[Effect]:
        full = self.phase is Phase.LIST  # otherwise REBUILD's fresh item of one conversation
        for item in frame.sessions:
            first_sight = item.conversation_id not in self.state.conversations
            c = self.state.conversation(item.conversation_id)
            c.apply_session(item, first_sight)
            self._listed.add(item.conversation_id)
            self._dirty.add(item.conversation_id)
            self._stalled.pop(item.conversation_id, None)
        effects: list[Effect] = []
        if not full:
            for item in frame.sessions:
                effects += self._pull(self.state.conversations[item.conversation_id])
            return [self._save(), *effects]
        if not frame.last:
            return []
        gone = tuple(sorted(set(self.state.conversations) - self._listed))
        for cid in gone:  # left: no longer in the whole list
            del self.state.conversations[cid]
        self.phase = Phase.MAILBOX
        return [self._save(gone), ReadMailbox(self.state.cursor)]

    def _message(self, frame: MessageFrame) -> list[Effect]:
        c = self._known(frame.conversation_id, frame.conversation_seq)
        new = c.apply_message(frame, self.state.user_id or "", live=True)
        return ([Deliver(frame)] if new else []) + self._after_change(c)

    def _reply(self, frame: HistoryFrame | ReadOkFrame | RebuildOkFrame) -> list[Effect]:
        request = self._pop(frame)
        c = self.state.conversations.get(frame.conversation_id)
        if isinstance(frame, HistoryFrame):
            return self._history(frame, c)
        if isinstance(frame, ReadOkFrame) and c is not None:
            c.apply_read(frame.read_seq)
            self._dirty.add(c.conversation_id)
        assert request.ticket is not None
        return [self._save(), Resolve(request.ticket, frame)]

    def _history(self, frame: HistoryFrame, c: ConversationState | None) -> list[Effect]:
        self._pulling.pop(frame.conversation_id, None)
        if c is None:
            return []
        effects: list[Effect] = []
        progress = False
        for m in frame.messages:
            if c.apply_message(m, self.state.user_id or "", live=False):
                effects.append(Deliver(m))
                progress = True
        if frame.latest_conversation_seq > c.latest_seq:
            c.latest_seq = frame.latest_conversation_seq
        self._dirty.add(c.conversation_id)
        if not progress and not frame.more:
            self._stalled[c.conversation_id] = c.latest_seq  # the views do not serve it yet
        return [*effects, self._save(), *self._pull(c)]

    def _error(self, error: ApiError) -> list[Effect]:
        if self.phase is Phase.AUTH:
            self.refused = error  # the close follows; the transport decides with it
            return []
        if not self._inflight:
            raise ProtocolViolation(f"an ERROR frame that answers nothing: {error}")
        request = self._inflight.popleft()
        if action_for_error(error) is Action.RETRY and request.attempts < MAX_RETRIES:
            request.attempts += 1
            return [RetryLater(retry_delay(error.retry_after, request.attempts, self.rng), request)]
        if request.ticket is not None:
            return [Resolve(request.ticket, error)]
        cid = request.conversation_id
        self._pulling.pop(cid, None)
        if error.code in ("NOT_A_MEMBER", "NOT_FOUND") and cid in self.state.conversations:
            del self.state.conversations[cid]  # left since the session list
            return [self._save((cid,))]
        self.failures[cid] = error  # the gap stays open and visible
        return []

    # -- helpers -------------------------------------------------------------------------------------

    def _known(self, conversation_id: str, seq: int) -> ConversationState:
        """The conversation's state; one first seen by a live frame or a mailbox entry (joined
        after the session list was read) starts just before that seq."""
        c = self.state.conversations.get(conversation_id)
        if c is None:
            c = self.state.conversation(conversation_id)
            c.floor = c.read_seq = seq - 1
        return c

    def _after_change(self, c: ConversationState) -> list[Effect]:
        self._dirty.add(c.conversation_id)
        return [self._save(), *self._pull(c)]

    def _pull(self, c: ConversationState) -> list[Effect]:
        """PULL_HISTORY of the first range not held (one pull per conversation in the air)."""
        cid = c.conversation_id
        if self.phase is not Phase.LIVE or cid in self._pulling or cid in self.failures:
            return []
        if self._stalled.get(cid, -1) >= c.latest_seq:
            return []
        gaps = c.gaps()
        if not gaps:
            return []
        first, last = gaps[0]
        self._pulling[cid] = (first, last)
        frame = {"type": "PULL_HISTORY", "conversation_id": cid, "after_seq": first - 1,
                 "limit": min(MAX_PULL, last - first + 1)}  # fmt: skip
        return self._send(Request(frame))

    def _request(self, frame: dict[str, Any]) -> tuple[int, list[Effect]]:
        self._tickets += 1
        request = Request(frame, self._tickets)
        if self.phase is not Phase.LIVE:
            self._waiting.append(request)
            return request.ticket or 0, []
        return self._tickets, self._send(request)

    def _send(self, request: Request) -> list[Effect]:
        self._inflight.append(request)
        return [Send(request.frame)]

    def _pop(self, frame: HistoryFrame | ReadOkFrame | RebuildOkFrame) -> Request:
        want = {HistoryFrame: "PULL_HISTORY", ReadOkFrame: "MARK_READ", RebuildOkFrame: "REBUILD"}[type(frame)]
        if not self._inflight or self._inflight[0].kind != want:
            raise ProtocolViolation(f"{frame.type} answers no {want} in the air")
        return self._inflight.popleft()

    def _save(self, removed: tuple[str, ...] = ()) -> Save:
        changed = tuple(self.state.conversations[cid] for cid in sorted(self._dirty) if cid in self.state.conversations)
        self._dirty.clear()
        return Save(self.state.tenant, self.state.user_id, self.state.cursor, changed, removed)
