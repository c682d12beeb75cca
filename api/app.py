"""The HTTP/WebSocket API of the embedded runtime (aiohttp demos style): a
`create_app` factory, resources under typed AppKeys, cleanup in `cleanup_ctx`."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from api.commands import CommandLane
from api.endpoint import ADMIN, spec_of
from api.errors import error_middleware
from api.keys import (
    COMMANDS,
    EXECUTOR,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    METRICS,
    RUNTIME,
    SECRET,
    SOCKETS,
    TOKENS,
    WATCH,
    blocking,
)
from api.metrics import Metrics
from api.routes import setup_routes
from api.ws import close_sockets
from fanout.overload import fd_soft_limit, raise_fd_limit
from fanout.rereview import INTERVAL, ReReviewWatch
from fanout.runtime import Runtime
from fanout.security import TokenVerifier
from projections.failures import Throttled

log = logging.getLogger("fanout.api")
throttled = Throttled(log)

# Commands are serialized by the application's lock anyway; the extra threads keep reads
# and the REBUILD waits for projection from starving sends.
EXECUTOR_THREADS = 8


async def executor_ctx(app: web.Application) -> AsyncIterator[None]:
    """The threads that run blocking (SQLite) commands and reads off the event loop, and
    the sends' own thread (api/commands.py)."""
    app[EXECUTOR] = ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="fanout-api")
    app[COMMANDS] = CommandLane(asyncio.get_running_loop(), group=app[RUNTIME].app.grouped)
    yield
    app[COMMANDS].close()
    app[EXECUTOR].shutdown(wait=True, cancel_futures=True)


async def watch_ctx(app: web.Application) -> AsyncIterator[None]:
    """ADR-0003's re-review conditions evaluated once a second (ADR-0026), off the event loop;
    every API process does it, the memo's compare-and-set and the episode's review key keep
    it to one review per episode."""

    async def loop() -> None:
        while True:
            try:
                await blocking(app, app[WATCH].evaluate)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                throttled("rereview", logging.WARNING, "re-review watch: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(INTERVAL)

    task = asyncio.get_running_loop().create_task(loop())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# Descriptors kept free of WebSockets: SQLite (3 per connection: pool, thread readers, writer,
# event store), RocksDB files, HTTP requests. The socket bound is capped below the fd limit by this.
FD_RESERVE = 256
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@web.middleware
async def backpressure_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a write the read side must materialize while it cannot keep up (503
    UNAVAILABLE, ADR-0010). Admin routes are exempt: enabling mention_only or rolling a
    tier back is how an operator relieves the load. O(1): no query."""
    if request.method in WRITES:
        spec = spec_of(request.match_info.handler)
        if spec is not None and spec.roles is not None and spec.roles != ADMIN:
            request.app[RUNTIME].backpressure.check()
    return await handler(request)


def connection_bound(configured: int) -> int:
    """FANOUT_MAX_CONNECTIONS, capped so a refused socket still gets its ERROR frame
    instead of the process running out of descriptors."""
    fit = max(1, fd_soft_limit() - FD_RESERVE)
    if fit < configured:
        log.warning(
            "at most %d WebSockets (open-file limit %d), not FANOUT_MAX_CONNECTIONS=%d",
            fit,
            fd_soft_limit(),
            configured,
        )
    return min(configured, fit)


async def quiet_accept_errors(app: web.Application) -> None:
    """on_startup: out of descriptors on accept() is one log line per interval, not a
    traceback per attempt (asyncio retries the accept a second later by itself)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS:
            throttled(
                "accept", logging.ERROR, "cannot accept connections: %s (open-file limit %d)", exc, fd_soft_limit()
            )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def create_app(runtime: Runtime, secret: str, *, metrics: Metrics | None = None) -> web.Application:
    """The API over a runtime. The caller owns the runtime: start it before serving,
    close it after the app's cleanup."""
    app = web.Application(middlewares=[error_middleware, backpressure_middleware], client_max_size=MAX_BODY_BYTES)
    app[RUNTIME] = runtime
    app[SECRET] = secret
    app[TOKENS] = TokenVerifier(secret)
    app[METRICS] = metrics if metrics is not None else Metrics(runtime)
    app[WATCH] = app[METRICS].watch = ReReviewWatch(runtime)
    app[SOCKETS] = weakref.WeakSet()
    app[MAX_CONNECTIONS] = connection_bound(runtime.params.max_connections)
    app.on_startup.append(quiet_accept_errors)
    app.cleanup_ctx.append(executor_ctx)
    app.cleanup_ctx.append(watch_ctx)  # after the executor it runs on
    app.on_shutdown.append(close_sockets)
    setup_routes(app)
    return app


class CannotListen(OSError):
    """The address cannot be listened on (in use, not ours, no such host): one line for the CLI."""


def listen(host: str, port: int, backlog: int = 128) -> list[socket.socket]:
    """Bind and listen on every address of host:port, before anything says "serving"
    (`fanout serve` binds first, so a port in use is one line of error, not a traceback
    after a start-up banner). Options as asyncio's create_server sets them."""
    where = f"{host}:{port}"
    if not 0 <= port <= 65535:
        raise CannotListen(f"cannot listen on {where}: the port must be 0 to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {where}: {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = "the address is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise CannotListen(f"cannot listen on {where}: {reason}") from None
    return sockets


def run(
    runtime: Runtime,
    secret: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (`fanout serve`) on `sockets` (from `listen`), or on
    host:port bound here. Starts the runtime's projectors if they are not running; closing
    the runtime stays with the caller (`with bootstrap(...)`)."""
    if sockets is None:
        sockets = listen(host, port)
    if not runtime.running:
        runtime.start()
    before, after = raise_fd_limit()
    if after != before:
        print(f"fanout: open-file limit raised from {before} to {after}", flush=True)
    web.run_app(
        create_app(runtime, secret),
        sock=sockets,
        print=lambda _: log.info("fanout API on http://%s:%s", host, port),
        access_log=None,
    )
