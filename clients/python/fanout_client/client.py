"""The user side over aiohttp: a WebSocket to `/v1/ws` and HTTP for the mailbox, feeding
the sans-I/O SyncCore and carrying out what it asks. Reconnects with jittered backoff and
resumes from the stored state; a refused token is renewed through the refresh callback;
every close code is handled as errors.action_for_close says."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
from collections.abc import Callable
from typing import Any

import aiohttp

from fanout_client.backoff import backoff_delay, retry_delay
from fanout_client.core import Deliver, Effect, Phase, ReadMailbox, Request, Resolve, RetryLater, Save, Send, SyncCore
from fanout_client.errors import (
    Action,
    ApiError,
    AuthenticationFailed,
    Closed,
    FanoutClientError,
    action_for_close,
    close_error,
)
from fanout_client.http import Http, Refresh, Token
from fanout_client.models import Message, ReadOkFrame, RebuildOkFrame
from fanout_client.state import ClientState
from fanout_client.stores import StateStore

MAILBOX_PAGE = 1000


class NotCaughtUp(FanoutClientError):
    """wait_caught_up timed out: the open gaps and failed pulls are in the message."""


class UserClient:
    def __init__(
        self,
        url: str,
        token: str,
        store: StateStore,
        *,
        refresh_token: Refresh | None = None,
        on_message: Callable[[Message], None] | None = None,
        max_reconnects: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.store = store
        self.token = Token(token, refresh_token)
        self.on_message = on_message
        self.max_reconnects = max_reconnects
        self.rng = rng or random.Random()
        self.core = SyncCore(store.load(), self.rng)
        self.connections = 0  # connections that reached AUTH_OK
        self.error: BaseException | None = None  # why run() gave up
        self.last_close: Closed | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._send_lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def state(self) -> ClientState:
        return self.core.state

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> UserClient:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="fanout-client")

    async def close(self) -> None:
        self._closing = True
        if self._ws is not None:
            await self._ws.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, FanoutClientError):
                await self._task
        if self._session is not None:
            await self._session.close()

    def drop(self) -> None:
        """Break the socket as a network failure would (no close frame): the client resumes."""
        sock = self._ws.get_extra_info("socket") if self._ws is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)

    async def wait_caught_up(self, timeout: float = 30.0) -> ClientState:
        """Until the client rule has run to the end (every gap it can see pulled); raises why not."""
        self.start()
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: self.core.caught_up or self.error is not None)
        except TimeoutError:
            raise NotCaughtUp(self.describe()) from None
        if self.error is not None:
            raise self.error
        return self.state

    def describe(self) -> str:
        """Why the client is not caught up, in one line."""
        if self.error is not None:
            return str(self.error)
        if self.core.phase is not Phase.LIVE or self._ws is None:
            last = self.last_close
            why = "" if last is None else f" (last connection: {last.error or last.reason or last.code})"
            return f"not caught up: {self.core.phase.value}{why}"
        gaps = {cid: c.gaps() for cid, c in self.state.conversations.items() if c.gaps()}
        failed = {cid: str(e) for cid, e in self.core.failures.items()}
        return f"not caught up: open gaps {gaps}" + (f", failed pulls {failed}" if failed else "")

    # -- the app's requests ---------------------------------------------------------------------------

    async def mark_read(self, conversation_id: str, read_seq: int | None = None) -> ReadOkFrame:
        result = await self._request(*self.core.mark_read(conversation_id, read_seq))
        assert isinstance(result, ReadOkFrame)
        return result

    async def rebuild(self, conversation_id: str) -> RebuildOkFrame:
        result = await self._request(*self.core.rebuild(conversation_id))
        assert isinstance(result, RebuildOkFrame)
        return result

    async def _request(self, ticket: int, effects: list[Effect]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[ticket] = future
        await self._apply(effects)
        return await future

    # -- the connection loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, sync and follow until close(); reconnect as the close says."""
        self._session = self._session or aiohttp.ClientSession()
        attempt = 0
        try:
            while not self._closing:
                reached_live = self.connections
                closed = self.last_close = await self._connect_once()
                if self._closing:
                    return
                if self.connections > reached_live and self.core.phase is Phase.LIVE:
                    attempt = 0  # a connection that worked: start the backoff again
                action = action_for_close(closed)
                if action is Action.GIVE_UP:
                    raise close_error(closed)
                if action is Action.REAUTH:
                    if await self.token.renew():
                        continue
                    raise closed.error or AuthenticationFailed("UNAUTHENTICATED", "the token was refused")
                if self.max_reconnects is not None and attempt >= self.max_reconnects:
                    raise close_error(closed)
                hint = closed.error.retry_after if closed.error is not None else None
                delay = (
                    retry_delay(hint, attempt, self.rng) if action is Action.RETRY else backoff_delay(attempt, self.rng)
                )
                attempt += 1
                await asyncio.sleep(delay)
        except (FanoutClientError, aiohttp.ClientError, OSError) as exc:
            self.error = exc
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(exc)
            async with self._changed:
                self._changed.notify_all()
            raise

    async def _connect_once(self) -> Closed:
        assert self._session is not None
        try:
            ws = await self._session.ws_connect(self.url.replace("http", "ws", 1) + "/v1/ws", heartbeat=30.0)
        except (aiohttp.ClientError, OSError) as exc:
            return Closed(None, str(exc))
        self._ws = ws
        try:
            await self._apply(self.core.connect(self.token.value))
            while True:
                msg = await ws.receive()
                if msg.type is aiohttp.WSMsgType.TEXT:
                    phase = self.core.phase
                    await self._apply(self.core.receive(json.loads(msg.data)))
                    if phase is Phase.AUTH and self.core.phase is not Phase.AUTH:
                        self.connections += 1
                elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                    reason = msg.extra if isinstance(msg.extra, str) else ""
                    return Closed(ws.close_code, reason, self.core.refused)
                elif msg.type is aiohttp.WSMsgType.ERROR:
                    return Closed(None, str(msg.data))
        except (aiohttp.ClientError, OSError, ConnectionError) as exc:
            return Closed(None, str(exc))
        except ApiError as exc:  # the mailbox read refused for good
            return Closed(None, str(exc), exc)
        finally:
            self._ws = None
            if not ws.closed:
                await ws.close()
            async with self._changed:
                self._changed.notify_all()

    async def _apply(self, effects: list[Effect]) -> None:
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, Send):
                ws = self._ws
                if ws is None or ws.closed:
                    continue  # the next connection sends what still matters
                async with self._send_lock:
                    await ws.send_str(json.dumps(effect.frame, ensure_ascii=False))
            elif isinstance(effect, Save):
                self.store.save(effect)
            elif isinstance(effect, ReadMailbox):
                queue += self.core.mailbox_page(await self._mailbox(effect.after))
            elif isinstance(effect, Deliver):
                if self.on_message is not None:
                    self.on_message(effect.message)
            elif isinstance(effect, Resolve):
                future = self._pending.pop(effect.ticket, None)
                if future is not None and not future.done():
                    if isinstance(effect.result, ApiError):
                        future.set_exception(effect.result)
                    else:
                        future.set_result(effect.result)
            elif isinstance(effect, RetryLater):
                asyncio.get_running_loop().call_later(effect.delay, self._retry, effect.request)
        async with self._changed:
            self._changed.notify_all()

    def _retry(self, request: Request) -> None:
        if not self._closing:
            asyncio.ensure_future(self._apply(self.core.retry(request)))

    async def _mailbox(self, after: int) -> dict[str, Any]:
        assert self._session is not None
        http = Http(self._session, self.url, self.token, rng=self.rng)
        page, _ = await http.call("GET", "/v1/me/mailbox", params={"after": after, "limit": MAILBOX_PAGE})
        return dict(page)
