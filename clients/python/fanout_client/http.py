"""One HTTP call with the retry rule of the client, used by the user side (the mailbox) and
the service side: a refusal with a retry hint (429, 503: `Retry-After`, `details.retry_after_ms`)
is retried after the hint, the **same body** every time (so a `client_msg_id` is never reused
for another message); 401 asks the token source for a fresh token once; everything else is
raised as its exception class."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fanout_client.backoff import retry_delay
from fanout_client.errors import Action, ApiError, action_for_error, api_error

Refresh = Callable[[], Awaitable[str]]


@dataclass
class Token:
    """The current bearer token and how to get a fresh one (None: the token cannot be refreshed)."""

    value: str
    refresh: Refresh | None = None

    async def renew(self) -> bool:
        if self.refresh is None:
            return False
        fresh = await self.refresh()
        if not fresh or fresh == self.value:
            return False
        self.value = fresh
        return True


@dataclass
class Http:
    session: aiohttp.ClientSession
    base_url: str
    token: Token
    max_retries: int = 5
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, str]]:
        """The answer's JSON and headers; an ApiError subclass when refused for good."""
        data = (
            None if body is None else json.dumps(body, ensure_ascii=False).encode()
        )  # encoded once: retries resend it
        attempt, renewed = 0, False
        while True:
            headers = {"Authorization": f"Bearer {self.token.value}"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            async with self.session.request(
                method, self.base_url.rstrip("/") + path, data=data, params=params, headers=headers
            ) as resp:
                text = await resp.text()
                answer: Any = json.loads(text) if text else None
                if resp.status < 400:
                    return answer, dict(resp.headers)
                error = as_error(resp.status, answer, resp.headers.get("Retry-After"))
            action = action_for_error(error)
            if action is Action.REAUTH and not renewed and await self.token.renew():
                renewed = True
                continue
            if action is Action.RETRY and attempt < self.max_retries:
                await self.sleep(retry_delay(error.retry_after, attempt, self.rng))
                attempt += 1
                continue
            raise error


def as_error(status: int, body: Any, retry_after: str | None = None) -> ApiError:
    """The error body as its exception; the Retry-After header fills in a missing retry_after_ms."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return api_error("INTERNAL" if status >= 500 else "HTTP_ERROR", f"HTTP {status}: {body!r}"[:300], {}, status)
    details = dict(body.get("details") or {})
    if "retry_after_ms" not in details and retry_after is not None and retry_after.isdigit():
        details["retry_after_ms"] = int(retry_after) * 1000
    return api_error(body["error"], str(body.get("message", "")), details, status)
