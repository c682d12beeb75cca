"""Operations: health, readiness, metrics, and the OpenAPI document of every route."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from tests.e2e.conftest import Api, Server, conversation, expect, serving

METRIC_NAMES = [
    "fanout_entries_per_sec",
    "conversation_active_member_ratio",
    "fanout_admission_rejections_total",
    "fanout_projection_lag",
    "fanout_review_triggers_total",
    "fanout_online_pushes_total",
    "fanout_group_commits_total",
    "fanout_grouped_commands_total",
    "fanout_group_fallbacks_total",
    "fanout_write_conflicts_total",
    "fanout_send_seconds_bucket",
]


async def test_healthz_and_readyz_answer_without_a_token(api: Api) -> None:
    anon = api.anonymous()
    assert expect(await anon.call("GET", "/healthz"), 200) == {"status": "ok"}
    ready = expect(await anon.call("GET", "/readyz"), 200)
    assert ready["status"] == "ready" and ready["running"] is True and ready["last_error"] is None


async def test_readyz_is_503_while_the_projectors_are_not_running(tmp_path: Path) -> None:
    with serving(tmp_path, start_runtime=False) as server:
        async with aiohttp.ClientSession() as session, session.get(server.url + "/readyz") as resp:
            assert resp.status == 503
            body = await resp.json()
        assert body["status"] == "not_ready" and body["running"] is False


async def test_metrics_expose_every_documented_series_in_prometheus_text(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await svc.send(cid, sender="ann", text="measure me"), 201)
    await svc.materialized(cid, 1)
    async with api.session.get(api.server.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    for name in METRIC_NAMES:
        assert f"\n{name}" in text or text.startswith(name), name
    assert 'conversation_active_member_ratio{size_bucket="small"}' in text
    assert "fanout_projection_lag " in text
    if api.server.kind == "distributed":  # an API replica keeps the heads its logins read (ADR-0035)
        for name in ("fanout_head_cache_heads_total", "fanout_head_cache_resets_total", "fanout_head_cache_size"):
            assert f"\n{name}" in text, name
        # and holds its clock to the event store's (ADR-0041): the same host, so within a second
        skew = next(line for line in text.splitlines() if line.startswith("fanout_clock_skew_seconds "))
        assert abs(float(skew.split()[1])) < 1.0, skew
        assert "\nfanout_clock_skew_refusals_total 0.0" in text


async def test_the_openapi_document_describes_every_route_the_app_registers(api: Api, server: Server) -> None:
    doc = expect(await api.anonymous().call("GET", "/v1/openapi.json"), 200)
    assert doc["openapi"].startswith("3.1")
    registered = {
        (resource.canonical, route.method.lower()) for resource in server.app.router.resources() for route in resource
    }
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert registered == documented
    assert len(registered) >= 24
    schemas = doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["summary"], (path, method)
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if ref:
                assert ref["$ref"].rsplit("/", 1)[1] in schemas
    send = doc["paths"]["/v1/conversations/{cid}/messages"]["post"]
    assert send["x-roles"] == ["admin", "service"] and "429" in send["responses"]
    assert schemas["SendMessage"]["additionalProperties"] is False
    for frame in ("AuthFrame", "MarkReadFrame", "PullHistoryFrame", "RebuildFrame", "SessionListBatchFrame"):
        assert frame in schemas


async def test_stopping_the_server_closes_open_sockets_with_going_away(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        async with aiohttp.ClientSession() as session:
            api = Api(session, server)
            sock = await api.user("acme", "ann").socket()
            await sock.expect("AUTH_OK")
            await sock.session_list()
            assert server.runtime.hub.online_count() == 1
            started = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, server.stop)
            assert time.monotonic() - started < 5
            msg = await sock.ws.receive(timeout=5)
            assert msg.type is aiohttp.WSMsgType.CLOSE and msg.data == aiohttp.WSCloseCode.GOING_AWAY
            assert server.runtime.hub.online_count() == 0
