"""`GET /v1/openapi.json`: OpenAPI 3.1 built from the app's route table and the
`@endpoint` declarations, with the pydantic models' JSON schemas as components.
Every registered route is documented, by construction."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel, TypeAdapter

from api import schemas
from api.endpoint import endpoint, spec_of
from api.errors import STATUS, json_response
from api.keys import RUNTIME
from domain.identity import MAX_ID_LENGTH, MAX_TENANT_LENGTH
from domain.params import Parameters

# Read-your-writes headers (api/views.py sets and reads them).
POSITION_HEADER = "X-Fanout-Position"
MIN_POSITION_HEADER = "X-Fanout-Min-Position"

ROLE_TEXT = {
    frozenset({"service", "admin"}): "service or admin token",
    frozenset({"admin"}): "admin token",
    frozenset({"user"}): "user token (acts as its sub)",
}
# Path parameters, from the same types the bodies use (views.seq_param and the domain's
# id checks enforce the same rules).
PATH_SCHEMAS: dict[str, dict[str, Any]] = {
    "seq": TypeAdapter(schemas.MessageSeq).json_schema(),
    "cid": TypeAdapter(schemas.Id).json_schema(),
    "uid": TypeAdapter(schemas.Id).json_schema(),
    "size_bucket": {"type": "string", "enum": ["small", "medium", "large"]},
    "review_id": {"type": "string", "format": "uuid"},
}
TOKEN = (
    "An HS256 JWT (`fanout token`) with the claims tenant (1 to "
    f"{MAX_TENANT_LENGTH} ASCII letters, digits, '.', '_' or '-', starting with a letter or a digit), sub (an id: "
    f"1 to {MAX_ID_LENGTH} characters, no control characters or surrogates), role (user, service or admin) and exp. "
    "The tenant of every request is the token's."
)
ERROR_TEXT = {426: "INVALID_ARGUMENT: not a WebSocket upgrade (send Upgrade: websocket)"}
STRICT_JSON = (
    "Bodies and WebSocket frames must be strict JSON: UTF-8, one value, numbers finite (no NaN, Infinity or "
    "overflowing 1e999), integers within signed 64 bits (-2^63 .. 2^63-1), no lone surrogates, no duplicate keys; "
    "anything else is 400 INVALID_ARGUMENT naming the field. Every answer is strict JSON."
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _add_schema(components: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components[model.__name__] = schema


def _running_values(node: Any, params: Parameters) -> None:
    """Fill `maxLength` of a field bound to a setting (`x-max-length-param`) with the
    value this server runs with, e.g. text <= max_text_length."""
    if isinstance(node, dict):
        name = node.pop("x-max-length-param", None)
        if isinstance(name, str):
            node["maxLength"] = int(getattr(params, name))
        for value in node.values():
            _running_values(value, params)
    elif isinstance(node, list):
        for value in node:
            _running_values(value, params)


def _error_response(status: int) -> dict[str, Any]:
    codes = [c for c, st in STATUS.items() if st == status]
    return {
        "description": ERROR_TEXT.get(status) or " / ".join(codes),
        "content": {"application/json": {"schema": _ref(schemas.ErrorBody)}},
    }


def _error_statuses(spec: Any, method: str, params: list[dict[str, Any]]) -> list[int]:
    """The error statuses an operation can answer, by what it takes."""
    statuses = {500, *spec.errors}
    if spec.roles is not None:
        statuses |= {401, 403}
    if spec.body is not None or spec.query is not None or params:
        statuses.add(400)
    if params:
        statuses.add(404)
    if spec.body is not None:
        statuses.add(413)
    if method in ("POST", "DELETE") and spec.roles is not None and spec.response is not schemas.BatchResult:
        statuses.add(409)  # a batch answers each send's conflict in its results, never as the request's status
    if spec.response is schemas.SendResult:
        statuses.add(429)
    return sorted(statuses)


def _operation(method: str, path: str, handler: Any, components: dict[str, Any]) -> dict[str, Any]:
    spec = spec_of(handler)
    if spec is None:
        return {"summary": getattr(handler, "__name__", "route"), "responses": {"200": {"description": "OK"}}}
    op: dict[str, Any] = {"operationId": f"{method.lower()}_{handler.__name__}", "summary": spec.summary}
    if spec.description:
        op["description"] = spec.description
    params: list[dict[str, Any]] = []
    for name in re.findall(r"{(\w+)[^}]*}", path):
        params.append(
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": PATH_SCHEMAS.get(name, {"type": "string"}),
            }
        )
    if spec.query is not None:
        q = spec.query.model_json_schema()
        for name, prop in q.get("properties", {}).items():
            params.append({"name": name, "in": "query", "required": name in q.get("required", []), "schema": prop})
        if "min_position" in q.get("properties", {}):  # read-your-writes, also as a header
            params.append({"name": MIN_POSITION_HEADER, "in": "header", "required": False,
                           "schema": {"type": "integer", "minimum": 0},
                           "description": "same as min_position (the larger of both applies)"})  # fmt: skip
    if params:
        op["parameters"] = params
    if spec.body is not None:
        _add_schema(components, spec.body)
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(spec.body)}}}
    ok: dict[str, Any] = {"description": "Switching Protocols" if spec.ok == 101 else "OK"}
    if spec.response is not None:
        _add_schema(components, spec.response)
        ok["content"] = {"application/json": {"schema": _ref(spec.response)}}
    if method in ("POST", "DELETE") and spec.roles is not None:  # every write answers its log position
        ok["headers"] = {POSITION_HEADER: {"description": "the log position of this write: a read's min_position",
                                           "schema": {"type": "integer"}}}  # fmt: skip
    responses: dict[str, Any] = {str(spec.ok): ok}
    if spec.roles is not None:
        op["security"] = [{"bearer": []}]
        op["x-roles"] = sorted(spec.roles)
        op["description"] = (op.get("description", "") + f" Needs a {ROLE_TEXT.get(spec.roles, 'token')}.").strip()
    for status in _error_statuses(spec, method, params):
        responses[str(status)] = _error_response(status)
    op["responses"] = responses
    return op


def build(app: web.Application) -> dict[str, Any]:
    components: dict[str, Any] = {}
    _add_schema(components, schemas.ErrorBody)
    for frame in (*schemas.CLIENT_FRAMES, *schemas.SERVER_FRAMES):
        _add_schema(components, frame)
    paths: dict[str, dict[str, Any]] = {}
    for resource in app.router.resources():
        path = resource.canonical
        for route in resource:
            method = route.method.lower()
            if method == "*":
                continue
            paths.setdefault(path, {})[method] = _operation(route.method, path, route.handler, components)
    _running_values(components, app[RUNTIME].params)
    _running_values(paths, app[RUNTIME].params)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fanout",
            "version": "1",
            "description": "Large-group chat delivery with exact offline delivery. Errors are "
            '{"error": CODE, "message": str, "details": {...}}; RATE_LIMITED and FANOUT_QUOTA_EXCEEDED '
            "carry a Retry-After header and details.retry_after_ms. " + STRICT_JSON,
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT", "description": TOKEN}
            },
        },
    }


@endpoint("This document", roles=None)
async def openapi_json(request: web.Request, who: None, data: None) -> web.Response:
    return json_response(build(request.app))
