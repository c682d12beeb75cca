"""Typed application keys (aiohttp demos style) and the one way to call blocking code."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from aiohttp import web

from api.commands import CommandLane
from api.metrics import Metrics
from fanout.rereview import ReReviewWatch
from fanout.runtime import Runtime
from fanout.security import TokenVerifier

T = TypeVar("T")

MAX_BODY_BYTES = 1024 * 1024  # larger bodies are PAYLOAD_TOO_LARGE (client_max_size)

RUNTIME = web.AppKey("runtime", Runtime)  # the protocol: any runtime serves the API
SECRET = web.AppKey("secret", str)
TOKENS = web.AppKey("tokens", TokenVerifier)  # verify_token under SECRET, verified tokens remembered
METRICS = web.AppKey("metrics", Metrics)
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)
COMMANDS = web.AppKey("commands", CommandLane)  # the sends' thread (ADR-0024)
SOCKETS = web.AppKey("sockets", weakref.WeakSet[web.WebSocketResponse])
MAX_CONNECTIONS = web.AppKey("max_connections", int)  # open WebSockets (ADR-0010)
WATCH = web.AppKey("rereview", ReReviewWatch)  # ADR-0003's re-review conditions (ADR-0026)


async def blocking(app: web.Application, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Commands and view reads touch SQLite: run them off the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(app[EXECUTOR], partial(fn, *args, **kwargs))


async def command(app: web.Application, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A send: on the command lane, off the event loop (api/commands.py)."""
    return await app[COMMANDS].call(fn, *args, **kwargs)


async def commands(app: web.Application, calls: Sequence[Callable[[], Any]]) -> list[tuple[Any, BaseException | None]]:
    """Several sends in order as one item of the command lane; each one's (result, None) or
    (None, exception)."""
    return await app[COMMANDS].call_many(calls)
