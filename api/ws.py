"""WebSocket `/v1/ws` (SPEC section 6): AUTH -> AUTH_OK -> SESSION_LIST_BATCH... -> live
MESSAGE / HEAD frames, plus MARK_READ, PULL_HISTORY and REBUILD from the client.

After the session list, every outgoing frame goes through the connection's queue and
one writer task, so replies and live pushes never interleave mid-frame."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import ValidationError

from api import schemas
from api.endpoint import USER, Spec, authorize, parse_json, validation_details
from api.errors import error_response
from api.keys import MAX_BODY_BYTES, MAX_CONNECTIONS, METRICS, RUNTIME, SOCKETS, TOKENS, blocking
from api.reads import REBUILD_TIMEOUT, conversation_sessions, history, projected, scope
from domain.errors import FanoutError, InvalidArgument, RateLimited, Unavailable
from fanout import strict_json
from fanout.overload import storage_unavailable
from fanout.push import Connection
from fanout.security import Claims, Unauthenticated
from projections.errors import StorageError
from projections.failures import Throttled

log = logging.getLogger("fanout.api.ws")
throttled = Throttled(log)

AUTH_TIMEOUT = 10.0
Emit = Callable[[dict[str, Any]], None]


def error_frame(error: FanoutError) -> dict[str, Any]:
    return {"type": "ERROR", "error": error.code, "message": error.message, "details": dict(error.details)}


async def websocket(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_BODY_BYTES)
    if not ws.can_prepare(request).ok:  # a plain GET: say how to connect, as JSON
        return upgrade_required(request)
    await ws.prepare(request)
    sockets = request.app[SOCKETS]
    if len(sockets) >= request.app[MAX_CONNECTIONS]:  # overload is answered with a frame (ADR-0010)
        throttled("connections", logging.WARNING, "WebSocket refused: %d open (the bound)", len(sockets))
        await refuse(ws, too_many_connections(len(sockets)), code=WSCloseCode.TRY_AGAIN_LATER)
        return ws
    sockets.add(ws)
    try:
        claims = await authenticate(request, ws)
        if claims is not None:
            await session(request, ws, claims)
    except ConnectionError:
        pass  # the client went away
    except (OSError, StorageError) as exc:  # e.g. out of descriptors or a full disk mid-login
        throttled("login", logging.ERROR, "WebSocket session failed: %s", exc)
        if not ws.closed:
            error = storage_unavailable(exc) or Unavailable(
                "the server cannot serve this connection now; retry later", reason="overloaded", retry_after_ms=1000
            )
            with contextlib.suppress(Exception):
                await refuse(ws, error, code=WSCloseCode.TRY_AGAIN_LATER)
    finally:
        sockets.discard(ws)
        if not ws.closed:
            await ws.close()
    return ws


websocket.spec = Spec(  # type: ignore[attr-defined]
    "WebSocket sync: AUTH, SESSION_LIST_BATCH, live MESSAGE/HEAD, MARK_READ, PULL_HISTORY, REBUILD",
    roles=None,
    ok=101,
    errors=(426,),
    description=(
        "A WebSocket: connect with Connection: Upgrade and Upgrade: websocket (101 Switching Protocols); a GET "
        "without them is answered 426 with the JSON error body (INVALID_ARGUMENT) and an Upgrade: websocket header. "
        "Frames are strict JSON text like HTTP bodies. "
        "Send AUTH{token} (a user token) first; anything else is answered by an ERROR frame and a close. "
        "The server answers AUTH_OK, then one or more SESSION_LIST_BATCH frames (the last has last=true), "
        "then live MESSAGE and HEAD frames. Client frames MARK_READ, PULL_HISTORY and REBUILD are answered by "
        "READ_OK, HISTORY, REBUILD_OK (then a fresh SESSION_LIST_BATCH for that conversation); a failure is an "
        "ERROR frame with the HTTP API's error codes, and the connection stays open. "
        "Frame schemas: components/schemas/*Frame."
    ),
)


def upgrade_required(request: web.Request) -> web.Response:
    return error_response(
        "INVALID_ARGUMENT",
        f"{request.path} is a WebSocket endpoint: connect with Connection: Upgrade and Upgrade: websocket",
        {"upgrade": "websocket"},
        status=426,
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},
    )


async def authenticate(request: web.Request, ws: web.WebSocketResponse) -> Claims | None:
    """The first frame must be AUTH{token} with a user token; otherwise ERROR and close."""
    try:
        msg = await ws.receive(timeout=AUTH_TIMEOUT)
    except TimeoutError:
        await refuse(ws, Unauthenticated(f"send AUTH{{token}} within {AUTH_TIMEOUT:g} s"))
        return None
    if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
        return None
    try:
        if msg.type is not WSMsgType.TEXT:
            raise Unauthenticated("the first frame must be a text AUTH{token} frame")
        try:
            frame = schemas.AuthFrame.model_validate(parse_json(msg.data, "the frame"))
        except InvalidArgument as exc:
            raise Unauthenticated(f"the first frame must be AUTH{{token}}: {exc.message}", **exc.details) from None
        except ValidationError as exc:
            raise Unauthenticated("the first frame must be AUTH{token}", **validation_details(exc)) from None
        return authorize(request.app[TOKENS](frame.token), USER)
    except FanoutError as error:
        await refuse(ws, error)
        return None


async def send(ws: web.WebSocketResponse, data: bytes) -> None:
    """One text frame of strict JSON already encoded (strict_json.encode: UTF-8 bytes)."""
    await ws.send_frame(data, WSMsgType.TEXT)


def encoded_frame(frame: dict[str, Any]) -> bytes:
    """The frame as strict JSON; one that is not (a NaN / Infinity) becomes an ERROR frame,
    never invalid JSON."""
    try:
        return strict_json.encode(frame)
    except ValueError:
        log.exception("refusing to send a %s frame that is not strict JSON", frame.get("type"))
        return strict_json.encode(error_frame(FanoutError("internal error: the frame was not strict JSON")))


def next_encoded(frames: Iterator[dict[str, Any]]) -> bytes | None:
    """The next frame read and encoded (both off the event loop), None after the last."""
    frame = next(frames, None)
    return None if frame is None else encoded_frame(frame)


async def refuse(ws: web.WebSocketResponse, error: FanoutError, *, code: int = WSCloseCode.POLICY_VIOLATION) -> None:
    await send(ws, encoded_frame(error_frame(error)))
    await ws.close(code=code, message=error.code.encode())


def too_many_connections(open_now: int) -> Unavailable:
    return Unavailable(
        f"too many connections ({open_now} open); retry later", reason="too_many_connections", retry_after_ms=1000
    )


async def session(request: web.Request, ws: web.WebSocketResponse, claims: Claims) -> None:
    app, rt = request.app, request.app[RUNTIME]
    conn = Connection(tenant=claims.tenant, user_id=claims.sub, loop=asyncio.get_running_loop())
    # Registered before the session list is read: a message projected in between is
    # queued (and may repeat one in the list; clients keep the highest seq), never lost.
    rt.hub.register(conn)
    writer: asyncio.Task[None] | None = None
    try:
        await send(ws, encoded_frame({"type": "AUTH_OK", "user_id": claims.sub, "tenant": claims.tenant}))
        batches = rt.queries.session_batches(claims.tenant, claims.sub)
        try:  # produced lazily: each batch read and encoded off the loop, sent before the next is read
            while (data := await blocking(app, next_encoded, batches)) is not None:
                await send(ws, data)
        finally:  # a generator: release its read cursor even if the client left mid-list
            close = getattr(batches, "close", None)
            if close is not None:
                await blocking(app, close)
        writer = asyncio.create_task(write(ws, conn.queue))
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                await handle(app, claims, msg.data, conn.queue.put_nowait)
            elif msg.type is WSMsgType.BINARY:
                conn.queue.put_nowait(error_frame(InvalidArgument("frames are JSON text")))
            else:
                break
    finally:
        rt.hub.unregister(conn)
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer


async def write(ws: web.WebSocketResponse, queue: asyncio.Queue[dict[str, Any]]) -> None:
    while not ws.closed:
        frame = await queue.get()
        try:
            await send(ws, encoded_frame(frame))
        except (ConnectionError, RuntimeError):  # the peer went away; the reader ends the session
            return


async def handle(app: web.Application, claims: Claims, raw: str, emit: Emit) -> None:
    rt = app[RUNTIME]
    tenant, user = claims.tenant, claims.sub
    try:
        try:
            frame = schemas.CLIENT_FRAME.validate_python(parse_json(raw, "the frame"))
        except ValidationError as exc:
            raise InvalidArgument(frame_problem(exc), **validation_details(exc)) from None
        if isinstance(frame, schemas.MarkReadFrame):
            result = await blocking(app, rt.app.mark_read, tenant, frame.conversation_id, user, frame.read_seq)
            emit({"type": "READ_OK", **result})
        elif isinstance(frame, schemas.PullHistoryFrame):
            result = await blocking(app, history, rt, tenant, frame.conversation_id, user, frame.after_seq, frame.limit)
            emit({"type": "HISTORY", **result})
        else:
            result = await blocking(app, rt.app.request_rebuild, tenant, frame.conversation_id, user)
            emit({"type": "REBUILD_OK", **result})
            partition = scope(rt, tenant, frame.conversation_id)  # that conversation's log partition only
            await blocking(app, projected, rt, result["position"], REBUILD_TIMEOUT, partition)
            fresh = await blocking(app, conversation_sessions, rt, tenant, user, frame.conversation_id)
            emit({"type": "SESSION_LIST_BATCH", **fresh, "last": True})
    except FanoutError as error:
        if isinstance(error, RateLimited):  # the per-user command gate, as on HTTP
            app[METRICS].rejected(error)
        emit(error_frame(error))
    except Exception:
        log.exception("frame failed for %s/%s", tenant, user)
        emit(error_frame(FanoutError("internal error")))


def frame_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return "the frame is not valid JSON"
    if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
        return "type must be one of MARK_READ, PULL_HISTORY, REBUILD"
    where = ".".join(str(p) for p in first["loc"][1:]) or "frame"
    return f"{where}: {first['msg']}"


async def close_sockets(app: web.Application) -> None:
    """on_shutdown: tell every client we are going away, so the server can stop."""
    sockets: weakref.WeakSet[web.WebSocketResponse] = app[SOCKETS]
    for ws in list(sockets):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")
