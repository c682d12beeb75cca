"""One error type per failure a caller can act on. Each carries its wire code;
the HTTP status is chosen in one place (`api/errors.py`)."""

from __future__ import annotations

from typing import Any


class FanoutError(Exception):
    code = "INTERNAL"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidArgument(FanoutError):
    code = "INVALID_ARGUMENT"


class NotFound(FanoutError):
    code = "NOT_FOUND"


class AlreadyExists(FanoutError):
    code = "ALREADY_EXISTS"


class GroupFull(FanoutError):
    code = "GROUP_FULL"


class NotAMember(FanoutError):
    code = "NOT_A_MEMBER"


class RateLimited(FanoutError):
    """Rejected by an admission gate: `details.gate` says which, `retry_after_ms` when."""

    code = "RATE_LIMITED"


class FanoutQuotaExceeded(FanoutError):
    code = "FANOUT_QUOTA_EXCEEDED"


class ReviewRequired(FanoutError):
    """The mention_only tier can only be enabled by an approved review (ADR decision 3)."""

    code = "REVIEW_REQUIRED"


class Conflict(FanoutError):
    code = "CONFLICT"


class Unavailable(FanoutError):
    """Not answerable now, try again: e.g. the views have not reached a read's
    min_position in time (`details.position`, `retry_after_ms`); a write refused because
    the read side is too far behind, the disk is full or a connection bound is reached
    (`details.reason`: projection_lag, projector_failed, storage_full, storage_error,
    too_many_connections; ADR-0010), or the replica's clock too far from the event store's
    (clock_skew, ADR-0041). HTTP 503 with Retry-After."""

    code = "UNAVAILABLE"
