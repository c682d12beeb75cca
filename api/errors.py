"""Domain errors to HTTP, in one place: one middleware, one JSON shape
`{"error": CODE, "message": str, "details": {...}}` for every failure."""

from __future__ import annotations

import logging
import math
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from api.keys import MAX_BODY_BYTES, METRICS
from domain.errors import FanoutError, FanoutQuotaExceeded, RateLimited, Unavailable
from fanout import strict_json
from fanout.overload import storage_unavailable

log = logging.getLogger("fanout.api")

STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    "NOT_A_MEMBER": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "CONFLICT": 409,
    "GROUP_FULL": 409,
    "REVIEW_REQUIRED": 409,
    "PAYLOAD_TOO_LARGE": 413,
    "RATE_LIMITED": 429,
    "FANOUT_QUOTA_EXCEEDED": 429,
    "UNAVAILABLE": 503,
    "INTERNAL": 500,
}

ADMISSION = (RateLimited, FanoutQuotaExceeded)


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": code, "message": message, "details": details or {}}


def json_response(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """Every JSON answer of the API: strict JSON (a NaN or Infinity is a ValueError, which
    the middleware turns into a 500 INTERNAL instead of a body no client can parse), compact
    UTF-8 (strict_json.encode, ADR-0042)."""
    return web.Response(body=strict_json.encode(data), status=status, headers=headers, content_type="application/json")


def error_response(
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    *,
    status: int | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = error_body(code, message, details)
    try:
        text = strict_json.dumps(body)
    except ValueError:  # details that are not strict JSON: the error without them
        text = strict_json.dumps(error_body(code, message))
    return web.Response(
        text=text, content_type="application/json", status=status or STATUS.get(code, 500), headers=headers
    )


def error_item(error: FanoutError) -> dict[str, Any]:
    """One refused item of a batch: its status and the error body it would have had alone."""
    item = {"status": STATUS.get(error.code, 500), **error_body(error.code, error.message, dict(error.details))}
    try:
        strict_json.dumps(item)
    except ValueError:  # details that are not strict JSON: the error without them
        item["details"] = {}
    return item


def domain_error_response(error: FanoutError) -> web.Response:
    headers: dict[str, str] = {}
    if error.code == "UNAUTHENTICATED":
        headers["WWW-Authenticate"] = 'Bearer realm="fanout"'
    retry_ms = error.details.get("retry_after_ms")
    if isinstance(error, (*ADMISSION, Unavailable)) and isinstance(retry_ms, int) and retry_ms >= 0:
        # -1 means "never at this size" (cost above the bucket's capacity): no retry hint then.
        headers["Retry-After"] = str(max(1, math.ceil(retry_ms / 1000)))
    return error_response(error.code, error.message, dict(error.details), headers=headers)


def _http_error_response(exc: web.HTTPException, request: web.Request) -> web.Response:
    if exc.status == 404:
        return error_response("NOT_FOUND", f"no route {request.method} {request.path}")
    if exc.status == 405:
        allowed = sorted(getattr(exc, "allowed_methods", ()) or ())
        return error_response(
            "NOT_FOUND",
            f"{request.method} is not allowed on {request.path}",
            {"allowed_methods": allowed},
            status=405,
            headers={"Allow": ",".join(allowed)},
        )
    if exc.status == 413:
        return error_response("PAYLOAD_TOO_LARGE", "the request body is too large", {"max_bytes": MAX_BODY_BYTES})
    if 400 <= exc.status < 500:
        return error_response("INVALID_ARGUMENT", exc.text or exc.reason, status=exc.status)
    return error_response("INTERNAL", exc.reason, status=exc.status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except FanoutError as error:
        if isinstance(error, ADMISSION):
            request.app[METRICS].rejected(error)
        return domain_error_response(error)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error_response(exc, request)
    except Exception as exc:
        unavailable = storage_unavailable(exc)  # a full disk is 503 UNAVAILABLE, never a bare 500
        if unavailable is not None:
            return domain_error_response(unavailable)
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response("INTERNAL", "internal error")
