"""What the client does with each error code and close code of docs/PROTOCOL.md, in one
place, and the exceptions an app can catch (one per failure it can act on)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class FanoutClientError(Exception):
    """Base of every error this package raises."""


class ApiError(FanoutClientError):
    """The server refused a request: its error code, message and details (PROTOCOL "Errors")."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None, status: int | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = dict(details or {})
        self.status = status

    @property
    def retry_after(self) -> float | None:
        """The server's retry hint in seconds; None without one, and for -1 ("never at this size")."""
        ms = self.details.get("retry_after_ms")
        if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
            return ms / 1000.0
        return None


class AuthenticationFailed(ApiError):
    """The token was refused and no fresh one came from the refresh callback: give up."""


class Forbidden(ApiError):
    """The token's role may not do this (e.g. a service token on the WebSocket): give up."""


class NotAMember(ApiError):
    """The user is not (or no longer) a member of the conversation."""


class NotFound(ApiError):
    """No such conversation, message or route."""


class InvalidRequest(ApiError):
    """INVALID_ARGUMENT, PAYLOAD_TOO_LARGE: the request is wrong; resending it cannot help."""


class Conflict(ApiError):
    """ALREADY_EXISTS, CONFLICT, GROUP_FULL, REVIEW_REQUIRED: the state does not allow it."""


class RetriesExhausted(ApiError):
    """RATE_LIMITED, FANOUT_QUOTA_EXCEEDED, UNAVAILABLE or INTERNAL still answered after the
    retries allowed (or a retry hint of -1: it can never pass at this size)."""


class ProtocolViolation(FanoutClientError):
    """The server sent something PROTOCOL.md does not allow at that point."""


class StateMismatch(FanoutClientError):
    """The stored state belongs to another user or tenant than the token's."""


class Action(enum.Enum):
    RETRY = "retry after the hint"  # RATE_LIMITED, FANOUT_QUOTA_EXCEEDED, UNAVAILABLE, INTERNAL
    REAUTH = "refresh the token, then reconnect"  # UNAUTHENTICATED
    RESUME = "reconnect and sync from the stored state"  # 1001, a dropped socket
    GIVE_UP = "raise"  # everything a retry cannot fix


_CLASSES: dict[str, type[ApiError]] = {
    "UNAUTHENTICATED": AuthenticationFailed,
    "FORBIDDEN": Forbidden,
    "NOT_A_MEMBER": NotAMember,
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": InvalidRequest,
    "PAYLOAD_TOO_LARGE": InvalidRequest,
    "ALREADY_EXISTS": Conflict,
    "CONFLICT": Conflict,
    "GROUP_FULL": Conflict,
    "REVIEW_REQUIRED": Conflict,
    "RATE_LIMITED": RetriesExhausted,
    "FANOUT_QUOTA_EXCEEDED": RetriesExhausted,
    "UNAVAILABLE": RetriesExhausted,
    "INTERNAL": RetriesExhausted,
}
RETRYABLE = frozenset({"RATE_LIMITED", "FANOUT_QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL"})


def api_error(code: str, message: str, details: dict[str, Any] | None = None, status: int | None = None) -> ApiError:
    """The exception of an error code; an unknown code is a plain ApiError."""
    return _CLASSES.get(code, ApiError)(code, message, details, status)


def action_for_error(error: ApiError) -> Action:
    if error.code == "UNAUTHENTICATED":
        return Action.REAUTH
    if error.code in RETRYABLE and error.details.get("retry_after_ms") != -1:
        return Action.RETRY
    return Action.GIVE_UP


# WebSocket close codes the server uses (PROTOCOL "WebSocket /v1/ws"; aiohttp's WSCloseCode).
GOING_AWAY = 1001
POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013


@dataclass(frozen=True)
class Closed:
    """How a connection ended: the close code (None when the socket just broke), its reason,
    and the ERROR frame that came before it, if any."""

    code: int | None
    reason: str = ""
    error: ApiError | None = None


def action_for_close(closed: Closed) -> Action:
    """1008 carries the refusal's error code as its reason (UNAUTHENTICATED: re-auth; anything
    else: give up); 1013 is UNAVAILABLE (retry after the hint); 1001, an abnormal close or a
    broken socket mean resume from the stored state."""
    if closed.error is not None and closed.code in (POLICY_VIOLATION, TRY_AGAIN_LATER, None):
        return action_for_error(closed.error)
    if closed.code == POLICY_VIOLATION:
        return Action.REAUTH if closed.reason == "UNAUTHENTICATED" else Action.GIVE_UP
    if closed.code == TRY_AGAIN_LATER:
        return Action.RETRY
    return Action.RESUME


def close_error(closed: Closed) -> ApiError:
    """The exception to raise when giving up on `closed`."""
    if closed.error is not None:
        return closed.error
    code = closed.reason or "CLOSED"
    return api_error(code, f"the server closed the connection ({closed.code} {closed.reason})".strip())
