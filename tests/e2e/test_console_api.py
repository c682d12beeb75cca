"""The admin routes the reviewer console uses beyond the existing ones (ADR-0026): the
preview of enable_mention_only, alpha per conversation, the re-review conditions, and the
console's own files with their Content-Security-Policy. Bad input is a clear 4xx that
writes nothing. The browser drives the same routes in test_console_browser.py."""

from __future__ import annotations

import uuid

from tests.e2e.conftest import QUIET_GROUP, Api, Server, conversation, expect

# Embedded: these routes are the same code on both runtimes (reads of the views and of the
# command side); test_console_browser.py runs the console on the distributed runtime too.
RUNTIMES = ("embedded",)


def fresh_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


async def test_the_preview_names_the_conversations_that_would_switch_and_writes_nothing(
    api: Api, server: Server
) -> None:
    tenant = fresh_tenant()
    quiet, busy = "quiet-" + uuid.uuid4().hex[:6], "busy-" + uuid.uuid4().hex[:6]
    svc = await conversation(api, tenant, quiet, QUIET_GROUP)  # alpha 1/10 once ann sends
    await conversation(api, tenant, busy, ["ann", "bob"])
    expect(await svc.send(quiet, sender="ann", text="hi"), 201)
    expect(await svc.send(busy, sender="ann", text="hi"), 201)
    expect(await svc.send(busy, sender="bob", text="hi"), 201)  # alpha 1: never meets the criterion
    await svc.materialized(busy, 2)
    admin = api.admin(tenant)
    rid = expect(await admin.open_review(size_bucket="small"), 201)["review_id"]
    before = server.written()
    params = {"read_diffusion_min_saving": "1", "read_diffusion_max_active_ratio": "0.9"}
    got = expect(await admin.call("GET", f"/v1/admin/reviews/{rid}/preview", params=params), 200)
    assert got["switching"] == [quiet]
    by_id = {c["conversation_id"]: c for c in got["conversations"]}
    assert by_id[quiet]["members"] == 10 and abs(by_id[quiet]["alpha"] - 0.1) < 1e-9
    assert by_id[quiet]["members_estimated"] == 9 and by_id[busy]["switches"] is False
    assert got["members_estimated_unread"] == 9 and abs(got["saving_per_message"] - 9.0) < 1e-9
    assert got["entries_per_sec_saved"] >= 0
    assert server.written() == before  # a preview writes nothing
    # ... and deciding with the same parameters switches exactly those
    expect(await admin.decide(rid, decision="enable_mention_only", **{k: float(v) for k, v in params.items()}), 200)
    tiers = expect(await admin.tiers(), 200)["tiers"]
    assert next(t for t in tiers if t["size_bucket"] == "small")["conversations"] == [quiet]


async def test_a_preview_with_bad_parameters_is_invalid_argument_naming_the_field(api: Api, server: Server) -> None:
    admin = api.admin(fresh_tenant())
    rid = expect(await admin.open_review(size_bucket="small"), 201)["review_id"]
    before = server.written()
    path = f"/v1/admin/reviews/{rid}/preview"
    for params, field in (
        ({"read_diffusion_min_saving": "-1", "read_diffusion_max_active_ratio": "0.5"}, "read_diffusion_min_saving"),
        (
            {"read_diffusion_min_saving": "10", "read_diffusion_max_active_ratio": "2"},
            "read_diffusion_max_active_ratio",
        ),
        ({"read_diffusion_min_saving": "inf", "read_diffusion_max_active_ratio": "0.5"}, "read_diffusion_min_saving"),
    ):
        body = expect(await admin.call("GET", path, params=params), 400, "INVALID_ARGUMENT")
        assert body["details"]["field"] == field, body
    expect(await admin.call("GET", path, params={"read_diffusion_min_saving": "x"}), 400, "INVALID_ARGUMENT")
    expect(await admin.call("GET", path, params={}), 400, "INVALID_ARGUMENT")
    ok = {"read_diffusion_min_saving": "1", "read_diffusion_max_active_ratio": "0.5"}
    expect(await admin.call("GET", f"/v1/admin/reviews/{uuid.uuid4()}/preview", params=ok), 404, "NOT_FOUND")
    expect(await api.service("acme").call("GET", path, params=ok), 403, "FORBIDDEN")
    assert server.written() == before


async def test_alpha_lists_every_conversation_with_its_policy_as_analyze_does(api: Api, cid: str) -> None:
    tenant = fresh_tenant()
    svc = await conversation(api, tenant, cid, QUIET_GROUP)
    expect(await svc.send(cid, sender="ann", text="hi"), 201)
    await svc.materialized(cid, 1)
    admin = api.admin(tenant)
    got = expect(
        await admin.call(
            "GET",
            "/v1/admin/alpha",
            params={"read_diffusion_min_saving": "1", "read_diffusion_max_active_ratio": "0.9"},
        ),
        200,
    )
    small = next(b for b in got["buckets"] if b["size_bucket"] == "small")
    (row,) = small["per_conversation"]
    assert row["conversation_id"] == cid and row["members"] == 10 and row["meets"] is True
    assert row["write_policy"] == "always" and row["last_switch_at"] is None
    assert small["meet_enter"] == 1 and abs(small["alpha_mean"] - 0.1) < 1e-9
    body = expect(
        await admin.call("GET", "/v1/admin/alpha", params={"read_diffusion_min_saving": "1"}), 400, "INVALID_ARGUMENT"
    )
    assert body["details"]["field"] == "read_diffusion_max_active_ratio"


async def test_the_rereview_conditions_are_shown_with_their_data_and_the_checklist(api: Api) -> None:
    got = expect(await api.admin("acme").call("GET", "/v1/admin/rereview"), 200)
    assert [c["condition"] for c in got["conditions"]] == [1, 4, 7]
    assert all(c["state"] in ("red", "green", "unknown") for c in got["conditions"])
    assert got["conditions"][0]["limit"] == 7 * 86400.0
    assert [c["condition"] for c in got["checklist"]] == [2, 3, 5, 6, 8]
    expect(await api.user("acme", "ann").call("GET", "/v1/admin/rereview"), 403, "FORBIDDEN")
    async with api.session.get(api.server.url + "/metrics") as resp:
        text = await resp.text()
    assert "fanout_mailbox_unit_cost_estimate_us 2.5" in text
    assert 'fanout_rereview_condition_red{condition="1"} 0.0' in text


async def test_the_console_is_served_with_a_strict_content_security_policy(api: Api) -> None:
    for path, kind in (("/console/", "text/html"), ("/console/console.js", "text/javascript"),
                       ("/console/console.css", "text/css")):  # fmt: skip
        async with api.session.get(api.server.url + path) as resp:
            assert resp.status == 200, path
            assert resp.headers["Content-Type"].startswith(kind)
            csp = resp.headers["Content-Security-Policy"]
            assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
            text = await resp.text()
        if kind == "text/html":
            assert "<script>" not in text and " style=" not in text and "<style" not in text  # nothing inline
    for bad in ("/console/..%2Fviews.py", "/console/nope.js", "/console/.hidden.css"):
        async with api.session.get(api.server.url + bad) as resp:
            assert resp.status == 404, bad
    async with api.session.get(api.server.url + "/console", allow_redirects=False) as resp:
        assert resp.status == 302 and resp.headers["Location"] == "/console/"


async def test_the_tier_history_lists_enable_switches_and_rollback_in_order(api: Api, cid: str) -> None:
    tenant = fresh_tenant()
    svc = await conversation(api, tenant, cid, QUIET_GROUP)
    expect(await svc.send(cid, sender="ann", text="hi"), 201)
    await svc.materialized(cid, 1)
    admin = api.admin(tenant, sub="rita")
    rid = expect(await admin.open_review(size_bucket="small"), 201)["review_id"]
    expect(
        await admin.decide(
            rid, decision="enable_mention_only", read_diffusion_min_saving=1.0, read_diffusion_max_active_ratio=0.9
        ),
        200,
    )
    expect(await admin.roll_back("small", reason="too quiet"), 200)
    history = expect(await admin.call("GET", "/v1/admin/tiers/history"), 200)["history"]
    assert [(h["size_bucket"], h["event"]) for h in history] == [
        ("small", "Created"),
        ("small", "Enabled"),
        ("small", "ConversationEntered"),
        ("small", "RolledBack"),
        ("small", "ConversationExited"),
    ]
    assert history[1]["review_id"] == rid and history[1]["read_diffusion_max_active_ratio"] == 0.9
    assert history[2]["conversation_id"] == cid and history[3]["by"] == "rita" and history[3]["reason"] == "too quiet"
    assert expect(await api.admin(fresh_tenant()).call("GET", "/v1/admin/tiers/history"), 200)["history"] == []


async def test_every_route_the_console_calls_is_in_the_openapi_document_with_an_admin_or_service_role(
    api: Api,
) -> None:
    """The page uses only the public API: each path in console.js is a documented operation."""
    import re
    from pathlib import Path

    import api as api_package

    script = (Path(api_package.__file__).parent / "console_assets" / "console.js").read_text()
    called = {
        (method.lower(), re.sub(r"\$\{[^}]*\}", "{}", path))
        for method, path in re.findall(r'api\("(GET|POST)", [`"](/v1/[^`"?]+)', script)
    }
    assert len(called) >= 10, called
    doc = expect(await api.anonymous().call("GET", "/v1/openapi.json"), 200)
    documented = {(m, re.sub(r"\{[^}]*\}", "{}", p)): op for p, ops in doc["paths"].items() for m, op in ops.items()}
    for key in called:
        assert key in documented, key
        assert "admin" in documented[key]["x-roles"], key
