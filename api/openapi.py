"""`GET /v1/openapi.json`: OpenAPI 3.1 built from the app's route table and the
`@endpoint` declarations, with the pydantic models' JSON schemas as components.
Every registered route is documented, by construction."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from api import schemas
from api.endpoint import endpoint, spec_of
from api.errors import STATUS

ROLE_TEXT = {
    frozenset({"service", "admin"}): "service or admin token",
    frozenset({"admin"}): "admin token",
    frozenset({"user"}): "user token (acts as its sub)",
}
PATH_SCHEMAS: dict[str, dict[str, Any]] = {
    "seq": {"type": "integer", "minimum": 1},
    "size_bucket": {"type": "string", "enum": ["small", "medium", "large"]},
    "review_id": {"type": "string", "format": "uuid"},
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _add_schema(components: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components[model.__name__] = schema


def _error_response(code_list: list[str]) -> dict[str, Any]:
    return {
        "description": " / ".join(code_list),
        "content": {"application/json": {"schema": _ref(schemas.ErrorBody)}},
    }


def _error_statuses(spec: Any, method: str, params: list[dict[str, Any]]) -> list[int]:
    """The error statuses an operation can answer, by what it takes."""
    statuses = {500}
    if spec.roles is not None:
        statuses |= {401, 403}
    if spec.body is not None or spec.query is not None or params:
        statuses.add(400)
    if params:
        statuses.add(404)
    if spec.body is not None:
        statuses.add(413)
    if method in ("POST", "DELETE") and spec.roles is not None:
        statuses.add(409)
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
    if params:
        op["parameters"] = params
    if spec.body is not None:
        _add_schema(components, spec.body)
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(spec.body)}}}
    ok: dict[str, Any] = {"description": "OK"}
    if spec.response is not None:
        _add_schema(components, spec.response)
        ok["content"] = {"application/json": {"schema": _ref(spec.response)}}
    responses: dict[str, Any] = {str(spec.ok): ok}
    if spec.roles is not None:
        op["security"] = [{"bearer": []}]
        op["x-roles"] = sorted(spec.roles)
        op["description"] = (op.get("description", "") + f" Needs a {ROLE_TEXT.get(spec.roles, 'token')}.").strip()
    for status in _error_statuses(spec, method, params):
        responses[str(status)] = _error_response([c for c, st in STATUS.items() if st == status])
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
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fanout",
            "version": "1",
            "description": "Large-group chat delivery with exact offline delivery. Errors are "
            '{"error": CODE, "message": str, "details": {...}}; RATE_LIMITED and FANOUT_QUOTA_EXCEEDED '
            "carry a Retry-After header and details.retry_after_ms.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
    }


@endpoint("This document", roles=None)
async def openapi_json(request: web.Request, who: None, data: None) -> web.Response:
    return web.json_response(build(request.app))
