"""The HTTP/WebSocket API of the embedded runtime (aiohttp demos style): a
`create_app` factory, resources under typed AppKeys, cleanup in `cleanup_ctx`."""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from api.errors import error_middleware
from api.keys import EXECUTOR, MAX_BODY_BYTES, METRICS, RUNTIME, SECRET, SOCKETS
from api.metrics import Metrics
from api.routes import setup_routes
from api.ws import close_sockets
from fanout.runtime import EmbeddedRuntime

log = logging.getLogger("fanout.api")

# Commands are serialized by the application's lock anyway; the extra threads keep reads
# and the REBUILD waits for projection from starving sends.
EXECUTOR_THREADS = 8


async def executor_ctx(app: web.Application) -> AsyncIterator[None]:
    """The threads that run blocking (SQLite) commands and reads off the event loop."""
    app[EXECUTOR] = ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="fanout-api")
    yield
    app[EXECUTOR].shutdown(wait=True, cancel_futures=True)


def create_app(runtime: EmbeddedRuntime, secret: str, *, metrics: Metrics | None = None) -> web.Application:
    """The API over a runtime. The caller owns the runtime: start it before serving,
    close it after the app's cleanup."""
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    app[RUNTIME] = runtime
    app[SECRET] = secret
    app[METRICS] = metrics if metrics is not None else Metrics(runtime)
    app[SOCKETS] = weakref.WeakSet()
    app.cleanup_ctx.append(executor_ctx)
    app.on_shutdown.append(close_sockets)
    setup_routes(app)
    return app


def run(runtime: EmbeddedRuntime, secret: str, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve until SIGINT/SIGTERM (`fanout serve`). Starts the runtime's projectors if they
    are not running; closing the runtime stays with the caller (`with EmbeddedRuntime(...)`)."""
    if not runtime.runner.running:
        runtime.start()
    web.run_app(
        create_app(runtime, secret),
        host=host,
        port=port,
        print=lambda _: log.info("fanout API on http://%s:%s (data dir %s)", host, port, runtime.data_dir),
        access_log=None,
    )
