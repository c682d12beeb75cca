"""The service side of the HTTP API (PROTOCOL "service"): conversations, members, sends.

A send is idempotent by `client_msg_id`: a retry of the same id answers the same seq and
writes nothing. So every retry here resends the exact bytes of the first attempt (http.Http
encodes the body once), and a send without an id gets one before its first attempt, so a
retry after a lost answer cannot send the message twice."""

from __future__ import annotations

import random
import uuid
from typing import Any
from urllib.parse import quote

import aiohttp

from fanout_client.http import Http, Refresh, Token
from fanout_client.models import (
    BatchResult,
    ConversationCreated,
    ConversationHead,
    MemberRemoved,
    MembersAdded,
    SendResult,
)


def _id(value: str) -> str:
    return quote(value, safe="")


def new_client_msg_id() -> str:
    return f"cm-{uuid.uuid4().hex}"


class ServiceClient:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        refresh_token: Refresh | None = None,
        max_retries: int = 5,
        session: aiohttp.ClientSession | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._own_session = session is None
        self._session = session or aiohttp.ClientSession()
        self.http = Http(self._session, url, Token(token, refresh_token), max_retries, rng or random.Random())
        self.position = 0  # the highest log position a write answered: reads wait for it (read-your-writes)

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session:
            await self._session.close()

    async def _write(self, method: str, path: str, body: Any = None) -> Any:
        answer, headers = await self.http.call(method, path, body)
        position = headers.get("X-Fanout-Position", "")
        if position.isdigit():
            self.position = max(self.position, int(position))
        return answer

    async def create_conversation(
        self, conversation_id: str | None = None, *, title: str | None = None, members: list[str] | None = None
    ) -> ConversationCreated:
        body: dict[str, Any] = {}
        for key, value in (("conversation_id", conversation_id), ("title", title), ("members", members)):
            if value is not None:
                body[key] = value
        answer = await self._write("POST", "/v1/conversations", body)
        return ConversationCreated.model_validate(answer)

    async def add_members(self, conversation_id: str, user_ids: list[str]) -> MembersAdded:
        answer = await self._write("POST", f"/v1/conversations/{_id(conversation_id)}/members", {"user_ids": user_ids})
        return MembersAdded.model_validate(answer)

    async def remove_member(self, conversation_id: str, user_id: str) -> MemberRemoved:
        answer = await self._write("DELETE", f"/v1/conversations/{_id(conversation_id)}/members/{_id(user_id)}")
        return MemberRemoved.model_validate(answer)

    async def head(self, conversation_id: str) -> ConversationHead:
        params = {"min_position": self.position} if self.position else None
        answer, _ = await self.http.call("GET", f"/v1/conversations/{_id(conversation_id)}", params=params)
        return ConversationHead.model_validate(answer)

    async def send(
        self,
        conversation_id: str,
        sender: str,
        text: str,
        *,
        client_msg_id: str | None = None,
        **options: Any,
    ) -> SendResult:
        """One send (`options`: mentions, mention_all, reply_to_seq, announcement); retried
        under one client_msg_id, generated when not given."""
        body = {"sender": sender, "text": text, **options, "client_msg_id": client_msg_id or new_client_msg_id()}
        answer = await self._write("POST", f"/v1/conversations/{_id(conversation_id)}/messages", body)
        return SendResult.model_validate(answer)

    async def send_batch(self, messages: list[dict[str, Any]]) -> BatchResult:
        """1 to 100 sends, each `{conversation_id, sender, text, ...}`; each without a
        client_msg_id gets one first, so resending the batch (after a 503 or a lost answer)
        sends none twice. A refused message is a result with its `status` and error, not an
        exception; retry those with `messages` of the same ids."""
        body = {"messages": [{**m, "client_msg_id": m.get("client_msg_id") or new_client_msg_id()} for m in messages]}
        answer = await self._write("POST", "/v1/messages/batch", body)
        return BatchResult.model_validate(answer)
