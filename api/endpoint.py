"""What a handler needs before it runs: who is calling (the token, and nothing else,
gives the tenant), whether its role may call this route, and a validated body or query.

`@endpoint(...)` does that once for every route and records what it checked, so the
OpenAPI document is built from the same declarations the server enforces."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from api.keys import TOKENS
from domain.errors import InvalidArgument
from fanout import strict_json
from fanout.security import Claims, Forbidden, Unauthenticated

SERVICE = frozenset({"service", "admin"})  # admin may also call service routes
ADMIN = frozenset({"admin"})
USER = frozenset({"user"})

Handler = Callable[[web.Request, Any, Any], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Spec:
    summary: str
    roles: frozenset[str] | None  # None: no token needed
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    ok: int = 200
    response: type[BaseModel] | None = None
    description: str = ""
    errors: tuple[int, ...] = ()  # error statuses beyond those implied by roles, body and path


def bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("send Authorization: Bearer <token>")
    return token.strip()


def authorize(claims: Claims, roles: frozenset[str]) -> Claims:
    if claims.role not in roles:
        raise Forbidden(f"role {claims.role} may not call this route", role=claims.role, allowed_roles=sorted(roles))
    return claims


def validation_details(exc: ValidationError) -> dict[str, Any]:
    errors = exc.errors(include_url=False, include_input=False)
    for e in errors:
        ctx = e.get("ctx")
        if ctx:  # make the context JSON-safe (it may hold exception objects)
            e["ctx"] = {k: v if isinstance(v, int | float | str | bool | None) else str(v) for k, v in ctx.items()}
    return {"errors": errors}


def parse_json(raw: bytes | str, what: str = "the request body") -> Any:
    """Strict JSON (fanout.strict_json): not UTF-8, NaN / Infinity, an integer beyond 64 bits,
    a lone surrogate or a duplicate key is INVALID_ARGUMENT naming the field, before any model
    or the domain sees the value."""
    try:
        return strict_json.loads(raw)
    except strict_json.NotStrictJSON as exc:
        loc = list(exc.path)
        where = exc.where
        message = f"{where}: {exc.message}" if where else f"{what} is not strict JSON: {exc.message}"
        details: dict[str, Any] = {"errors": [{"type": "json_invalid", "loc": loc, "msg": exc.message}]}
        if where:
            details["field"] = where
        raise InvalidArgument(message, **details) from None


def validate_body(model: type[BaseModel], raw: bytes) -> BaseModel:
    data = parse_json(raw) if raw else {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidArgument(_summary(exc), **validation_details(exc)) from None


def validate_query(model: type[BaseModel], query: Any) -> BaseModel:
    try:
        return model.model_validate(dict(query))
    except ValidationError as exc:
        raise InvalidArgument(_summary(exc), **validation_details(exc)) from None


def _summary(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def endpoint(
    summary: str,
    *,
    roles: frozenset[str] | None,
    body: type[BaseModel] | None = None,
    query: type[BaseModel] | None = None,
    ok: int = 200,
    response: type[BaseModel] | None = None,
    description: str = "",
    errors: tuple[int, ...] = (),
) -> Callable[[Handler], Callable[[web.Request], Awaitable[web.StreamResponse]]]:
    spec = Spec(summary, roles, body, query, ok, response, description, errors)

    def wrap(fn: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        @functools.wraps(fn)
        async def handler(request: web.Request) -> web.StreamResponse:
            claims = None
            if roles is not None:
                claims = authorize(request.app[TOKENS](bearer(request)), roles)
            data: BaseModel | None = None
            if body is not None:
                data = validate_body(body, await request.read())
            elif query is not None:
                data = validate_query(query, request.query)
            return await fn(request, claims, data)

        handler.spec = spec  # type: ignore[attr-defined]
        return handler

    return wrap


def spec_of(handler: Any) -> Spec | None:
    return getattr(handler, "spec", None)
