"""The admin role: reviews, tiers and rollback, capacity and projections."""

from __future__ import annotations

import uuid

from tests.e2e.conftest import Api, Server, conversation, expect, quiet_group_with_review_enabled


def fresh_tenant() -> str:
    """Tiers are per tenant x size bucket: a test that changes one uses its own tenant."""
    return f"t-{uuid.uuid4().hex[:8]}"


async def test_an_admin_opens_lists_reads_and_decides_a_review(api: Api) -> None:
    tenant = fresh_tenant()
    admin = api.admin(tenant, sub="alice-ops")
    opened = expect(await admin.open_review(size_bucket="large", details={"why": "load test"}), 201)
    assert opened["status"] == "open" and opened["trigger"] == "manual"
    assert opened["size_bucket"] == "large" and opened["opened_by"] == "alice-ops"
    assert opened["details"] == {"why": "load test"}
    rid = opened["review_id"]

    listed = expect(await admin.reviews(), 200)["reviews"]
    assert [r["review_id"] for r in listed] == [rid]
    assert expect(await admin.review(rid), 200)["status"] == "open"

    decided = expect(await admin.decide(rid, decision="no_action", note="fine for now"), 200)
    assert decided["status"] == "decided" and decided["decision"] == "no_action"
    assert decided["decided_by"] == "alice-ops"
    assert expect(await admin.review(rid), 200)["decision"] == "no_action"


async def test_deciding_a_review_twice_is_a_conflict(api: Api, server: Server) -> None:
    admin = api.admin(fresh_tenant())
    rid = expect(await admin.open_review(size_bucket="medium"), 201)["review_id"]
    expect(await admin.decide(rid, decision="scale_out"), 200)
    before = server.written()
    expect(await admin.decide(rid, decision="rate_limit"), 409, "CONFLICT")
    assert server.written() == before


async def test_enable_mention_only_without_its_parameters_is_invalid_and_enables_nothing(
    api: Api, server: Server
) -> None:
    admin = api.admin(fresh_tenant())
    rid = expect(await admin.open_review(size_bucket="small"), 201)["review_id"]
    before = server.written()
    expect(await admin.decide(rid, decision="enable_mention_only"), 400, "INVALID_ARGUMENT")
    expect(
        await admin.decide(
            rid, decision="enable_mention_only", read_diffusion_min_saving=10, read_diffusion_max_active_ratio=2
        ),
        400,
        "INVALID_ARGUMENT",
    )
    expect(await admin.decide(rid, decision="switch_everything"), 400, "INVALID_ARGUMENT")
    expect(await admin.decide(rid, decision="no_action", extra=1), 400, "INVALID_ARGUMENT")
    assert server.written() == before
    assert all(t["state"] == "disabled" for t in expect(await admin.tiers(), 200)["tiers"])


async def test_bad_review_requests_are_invalid_or_not_found(api: Api) -> None:
    admin = api.admin(fresh_tenant())
    expect(await admin.open_review(size_bucket="huge"), 400, "INVALID_ARGUMENT")
    expect(await admin.open_review(size_bucket="small", trigger="T9"), 400, "INVALID_ARGUMENT")
    expect(await admin.open_review(), 400, "INVALID_ARGUMENT")
    expect(await admin.review("not-a-uuid"), 404, "NOT_FOUND")
    expect(await admin.review(str(uuid.uuid4())), 404, "NOT_FOUND")
    expect(await admin.decide(str(uuid.uuid4()), decision="no_action"), 404, "NOT_FOUND")


async def test_tiers_start_disabled_and_a_never_enabled_tier_cannot_be_rolled_back(api: Api) -> None:
    admin = api.admin(fresh_tenant())
    tiers = expect(await admin.tiers(), 200)["tiers"]
    assert [(t["size_bucket"], t["state"]) for t in tiers] == [
        ("small", "disabled"),
        ("medium", "disabled"),
        ("large", "disabled"),
    ]
    expect(await admin.roll_back("large"), 404, "NOT_FOUND")
    expect(await admin.roll_back("enormous"), 400, "INVALID_ARGUMENT")
    expect(await admin.call("POST", "/v1/admin/tiers/small/rollback", {}), 400, "INVALID_ARGUMENT")


async def test_an_approved_review_switches_a_quiet_group_to_mention_only_and_a_rollback_returns_it(
    api: Api, cid: str
) -> None:
    tenant = fresh_tenant()
    svc, admin, rid = await quiet_group_with_review_enabled(api, tenant, cid)
    (small, *_) = expect(await admin.tiers(), 200)["tiers"]
    assert small["state"] == "enabled" and small["review_id"] == rid
    assert small["conversations"] == [cid]

    sent = expect(await svc.send(cid, sender="ann", text="only the active"), 201)
    assert sent["write_policy"] == "mention_only"
    record = await svc.materialized(cid, 2)
    assert record["write_policy"] == "mention_only" and record["mailbox_entries"] == 1
    assert expect(await svc.head(cid), 200)["write_policy"] == "mention_only"

    listing = expect(await api.user(tenant, "quiet3").sessions(), 200)
    (item,) = listing["sessions"]
    assert item["write_policy"] == "mention_only" and item["delivered_conversation_seq"] == 1
    (big,) = listing["big_group_heads"]
    assert big["conversation_id"] == cid and big["latest_conversation_seq"] == 2 and big["unread_estimate"] == 2

    rolled = expect(await admin.roll_back("small", reason="incident 42"), 200)
    assert rolled["state"] == "disabled" and rolled["returned_to_always"] == [cid]
    assert expect(await svc.send(cid, sender="ann", text="everyone again"), 201)["write_policy"] == "always"
    assert (await svc.materialized(cid, 3))["mailbox_entries"] == 10
    expect(await admin.roll_back("small"), 409, "CONFLICT")


async def test_the_capacity_view_shows_rates_budgets_triggers_and_alpha(api: Api, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann", "bob"])
    expect(await svc.send(cid, sender="ann", text="count me"), 201)
    await svc.materialized(cid, 1)
    cap = expect(await api.admin("acme").capacity(), 200)
    assert cap["fanout_entries_per_sec"] > 0
    assert 0 < cap["budget_use"]["platform_fanout"] < 1
    assert cap["budget_use"]["mailbox_write_large_groups"] == 0
    assert cap["triggers"]["T1"]["firing"] is False and cap["triggers"]["T2"]["firing"] is False
    assert cap["alpha_by_bucket"]["small"]["conversations"] >= 1
    assert 0 <= cap["alpha_by_bucket"]["small"]["alpha_mean"] <= 1
    assert set(cap["alpha_by_bucket"]) == {"small", "medium", "large"}


async def test_the_projections_view_shows_position_and_lag(api: Api, server: Server, cid: str) -> None:
    svc = await conversation(api, "acme", cid, ["ann"])
    expect(await svc.send(cid, sender="ann", text="x"), 201)
    await svc.materialized(cid, 1)
    view = expect(await api.admin("acme").projections(), 200)
    assert view["running"] is True and view["log_position"] > 0
    # one row per projection and log partition (the embedded log has one, the Kafka topic several)
    assert [(p["name"], p["partition"]) for p in view["projections"]] == [
        (name, partition) for name in ("admin", "capacity", "delivery") for partition in server.partitions
    ]
    for p in view["projections"]:
        assert p["position"] <= p["log_position"]
        assert p["lag"] == p["log_position"] - p["position"]
        assert p["last_error"] is None
