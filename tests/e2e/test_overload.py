"""Overload (ADR-0010) through the real server: backpressure on projection lag, a read
side that cannot write (the projector fails on its store), and the WebSocket bound.
Every refusal is 503 UNAVAILABLE with a reason and Retry-After (a frame on WebSockets)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from api.keys import SOCKETS
from projections.errors import StorageFull
from projections.ports import MessageRefs
from tests.e2e.conftest import FAST, Api, Reply, Server, conversation, eventually, expect, serving


def unavailable(reply: Reply, reason: str) -> dict[str, Any]:
    body = expect(reply, 503, "UNAVAILABLE")
    assert body["details"]["reason"] == reason, body
    assert isinstance(body["details"]["retry_after_ms"], int) and body["details"]["retry_after_ms"] > 0
    assert int(reply.headers["Retry-After"]) >= 1
    return dict(body)


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info is not None]


async def projected(server: Server) -> None:
    assert await asyncio.get_running_loop().run_in_executor(
        None, server.runtime.wait_until, server.runtime.log_position(), 30.0
    )


async def test_sends_are_refused_while_the_projector_is_behind_and_accepted_after_catch_up(tmp_path: Path) -> None:
    params = dataclasses.replace(FAST, max_projection_lag_entries=5)
    with serving(tmp_path, params, start_runtime=False) as server:  # the projector is stopped
        async with aiohttp.ClientSession() as session:
            api = Api(session, server)
            svc = await conversation(api, "acme", "g", ["ann", "bob", "cid"])
            expect(await svc.send("g", sender="ann", text="1"), 201)  # 3 entries behind
            expect(await svc.send("g", sender="bob", text="2"), 201)  # 6 > 5 behind
            written = server.written()
            body = unavailable(await svc.send("g", sender="ann", text="3"), "projection_lag")
            assert body["details"]["lag_entries"] == 6
            unavailable(await api.user("acme", "ann").read("g", 1), "projection_lag")
            unavailable(await svc.add_members("g", ["dan"]), "projection_lag")
            assert server.written() == written  # a refused write writes nothing
            # the operator's routes stay open: they are how load is relieved
            expect(await api.admin("acme").open_review(size_bucket="small"), 201)

            server.runtime.start()
            await projected(server)
            sent = expect(await svc.send("g", sender="ann", text="3"), 201)
            await svc.materialized("g", sent["conversation_seq"])


async def test_a_projector_that_cannot_write_refuses_sends_until_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with serving(tmp_path) as server:
        async with aiohttp.ClientSession() as session:
            api = Api(session, server)
            svc = await conversation(api, "acme", "g", ["ann", "bob"])
            expect(await svc.send("g", sender="ann", text="before"), 201)
            await svc.materialized("g", 1)

            mailbox = server.runtime.views.mailbox

            def full(tenant: str, refs: MessageRefs) -> int:  # what the RocksDB store raises on a full disk
                raise StorageFull(f"IO error: While appending to file: {mailbox.path}/000004.log: No space left on device")

            monkeypatch.setattr(mailbox, "write", full)
            # Accepted before anything could know: the event is durable, its fan-out waits.
            accepted = expect(await svc.send("g", sender="bob", text="during"), 201)
            anon = api.anonymous()
            ready = await eventually(lambda: anon.call("GET", "/readyz"), lambda r: r.status == 503)
            assert "No space left on device" in ready.body["last_error"]
            for i in range(3):
                unavailable(await svc.send("g", sender="ann", text=f"refused {i}"), "storage_full")

            monkeypatch.undo()  # space returns: the projector reopens the store and catches up
            await eventually(lambda: anon.call("GET", "/readyz"), lambda r: r.status == 200)
            await svc.materialized("g", accepted["conversation_seq"])
            after = expect(await svc.send("g", sender="ann", text="after"), 201)
            assert after["conversation_seq"] == accepted["conversation_seq"] + 1  # the refused ones left no trace
            await svc.materialized("g", after["conversation_seq"])
    assert len(no_tracebacks(caplog)) == 1  # the first failure; the retries log one line per interval


async def test_websockets_over_the_bound_get_an_error_frame_and_1013(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with serving(tmp_path, dataclasses.replace(FAST, max_connections=3)) as server:
        async with aiohttp.ClientSession() as session:
            api = Api(session, server)
            admitted = []
            for user in ("ann", "bob", "cid"):
                sock = await api.user("acme", user).socket()
                await sock.expect("AUTH_OK")
                await sock.session_list()
                admitted.append(sock)
            for i in range(5):
                extra = await api.user("acme", f"extra{i}").socket()
                frame = await extra.expect("ERROR")
                assert frame["error"] == "UNAVAILABLE" and frame["details"]["reason"] == "too_many_connections"
                assert isinstance(frame["message"], str)
                msg = await extra.ws.receive(timeout=5)
                assert msg.type is aiohttp.WSMsgType.CLOSE and msg.data == aiohttp.WSCloseCode.TRY_AGAIN_LATER
            for sock in admitted[1:]:
                await sock.send(type="PULL_HISTORY", conversation_id="nope", after_seq=0, limit=10)
                assert (await sock.expect("ERROR"))["error"] != "UNAVAILABLE"  # the admitted ones still work
            await admitted[0].close()
            await eventually(lambda: _open_sockets(server), lambda n: n == 2)
            again = await api.user("acme", "ann").socket()
            await again.expect("AUTH_OK")
    assert no_tracebacks(caplog) == []


async def _open_sockets(server: Server) -> int:
    return len(server.app[SOCKETS])
