"""The reviewer console in a real browser (Debian's chromium driven by Playwright), as a
reviewer uses it, on the embedded runtime and on an API replica of the distributed one:
refused with a user token, in with an admin token; load drives T1 over its line and its
review appears with the evidence; bad form input is answered by the API's error in the page
and writes nothing; the server's preview names the conversation that would switch; deciding
switches it and the tiers show it; rollback returns it; re-review condition (1) turns red
under a short FANOUT_REREVIEW_HOLD. Each step's screenshot goes to the test's tmp dir, or with
CONSOLE_SCREENSHOTS=docs/console to the README's (from the embedded run). A second test: the
page's once-a-second poll keeps what the reviewer types and clicks in a review card and the tiers.

Chromium must start: when it cannot, these tests FAIL with the reason (never a skip);
`make test` installs it with apt-get where it is missing (Makefile `browser`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fanout.security import mint_token
from tests.e2e.conftest import FAST, QUIET_GROUP, SECRET, Api, Server, conversation, expect

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
# The screenshots of each step go to the test's tmp dir; CONSOLE_SCREENSHOTS=docs/console refreshes
# the README's (from the embedded run), so a test run does not rewrite tracked files.
SHOTS = os.environ.get("CONSOLE_SCREENSHOTS")

# A 2 s capacity window and a platform budget of 20 entries/s (T1 at 14/s): ten sends a second to
# a 10-member group hold T1 over its line; re-review condition (1) after 4 s of T1 instead of 7 days.
PARAMS = dataclasses.replace(
    FAST, capacity_window=2.0, platform_fanout_budget=20.0, rereview_hold=4.0, fresh_read_timeout=10.0
)
BUSY_GROUP = [f"b{i}" for i in range(10)]
STEP = 20_000  # ms: the longest a page element may take to show what the API says


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        try:
            b = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        except Exception as exc:
            pytest.fail(
                f"chromium did not start ({CHROMIUM}; `make test` installs it with apt-get install chromium): {exc}",
                pytrace=False,
            )
        try:
            yield b
        finally:
            await b.close()


async def keep_loading(api: Api, tenant: str, busy: str, stop: asyncio.Event) -> None:
    """The load: one message every 0.1 s to a 10-member group whose members are all active
    (alpha 1: it never meets the criterion, so enabling leaves its 10 entries a message),
    100 entries/s against T1's 14 for as long as the test runs."""
    svc = api.service(tenant)
    i = 0
    while not stop.is_set():
        i += 1
        await svc.send(busy, sender="b0", text=f"load {i}")
        await asyncio.sleep(0.1)


async def test_a_reviewer_takes_a_t1_review_from_evidence_to_rollback_in_the_browser(
    api: Api, server: Server, browser: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    shots = ROOT / SHOTS if SHOTS and server.kind == "embedded" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    tenant, cid = f"t-{uuid.uuid4().hex[:8]}", f"town-{uuid.uuid4().hex[:6]}"
    busy = f"team-{uuid.uuid4().hex[:6]}"
    svc = await conversation(api, tenant, cid, QUIET_GROUP)  # only ann active: alpha 1/10
    await conversation(api, tenant, busy, BUSY_GROUP)
    for member in BUSY_GROUP:  # every member active: alpha 1
        expect(await svc.send(busy, sender=member, text="here"), 201)
    stop = asyncio.Event()
    load: asyncio.Task[None] | None = None
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        await page.goto(server.url + "/console/")

        async def shot(name: str, selector: str | None = None) -> None:
            target = page.locator(selector) if selector else page
            await target.screenshot(path=str(shots / f"{name}.png"))

        # 1. a user token is refused with the API's own error, and not kept
        await page.fill("#token", mint_token(SECRET, tenant, "user", "ann"))
        await page.click("#token-form button")
        await page.wait_for_selector("#login-error:has-text('FORBIDDEN')", timeout=STEP)
        assert await page.evaluate("sessionStorage.length") == 0
        assert "token" not in page.url and "eyJ" not in page.url
        await shot("1-refused-user-token", "#login")

        # 2. an admin token opens the console; it is kept in sessionStorage only
        admin_token = mint_token(SECRET, tenant, "admin", "rita-reviewer")
        await page.fill("#token", admin_token)
        await page.click("#token-form button")
        await page.wait_for_selector("#app:not([hidden])", timeout=STEP)
        assert await page.evaluate("Object.values(sessionStorage)") == [admin_token]
        assert "eyJ" not in page.url

        # 3. load: T1 fires and its review appears with the evidence
        expect(await svc.send(cid, sender="ann", text="first"), 201)
        load = asyncio.create_task(keep_loading(api, tenant, busy, stop))
        await page.wait_for_selector("#trigger-T1:has-text('FIRING')", timeout=STEP)
        card = page.locator("form.review", has_text="(T1, small)")
        await card.wait_for(timeout=STEP)
        evidence = await card.locator("table.evidence").inner_text()
        assert "rate at the time" in evidence and "window" in evidence and tenant in evidence
        await shot("2-t1-review-with-evidence", "#capacity-section")
        await shot("3-open-review", "#reviews-section")

        # 4. bad input: the API's error is shown in the form, nothing is written (the review stays
        # open, no tier changes; the log position is no witness here: the re-review watch may open
        # its own review meanwhile)
        admin = api.admin(tenant)
        rid = await card.get_attribute("data-review-id")

        async def nothing_written() -> None:
            assert expect(await admin.review(str(rid)), 200)["status"] == "open"
            assert all(t["state"] == "disabled" for t in expect(await admin.tiers(), 200)["tiers"])

        await card.locator("select.decision").select_option("enable_mention_only")
        await card.locator("input.min-saving").fill("1")
        await card.locator("input.max-ratio").fill("2")
        # what was typed is in the fields (a poll once took the focus away between two keystrokes)
        assert [await card.locator(f"input.{f}").input_value() for f in ("min-saving", "max-ratio")] == ["1", "2"]
        await card.locator("button.decide-button").click()
        await card.locator(".form-error:has-text('INVALID_ARGUMENT')").wait_for(timeout=STEP)
        assert "read_diffusion_max_active_ratio" in await card.locator(".form-error").inner_text()
        await card.locator("input.max-ratio").fill("")
        await card.locator("button.preview-button").click()
        await card.locator(".form-error:has-text('INVALID_ARGUMENT')").wait_for(timeout=STEP)
        await shot("4-bad-input-refused", f"#{await card.get_attribute('id')}")
        await nothing_written()

        # 5. the server's preview names the conversation that would switch
        await card.locator("input.max-ratio").fill("0.9")
        assert [await card.locator(f"input.{f}").input_value() for f in ("min-saving", "max-ratio")] == ["1", "0.9"]
        await card.locator("button.preview-button").click()
        summary = card.locator(".preview-summary")
        await card.locator(".preview-summary, .form-error:not(:empty)").first.wait_for(timeout=STEP)
        assert await summary.count() == 1, await card.locator(".form-error").inner_text()
        text = await summary.inner_text()
        assert f"1 of 2 conversations would switch now: {cid}" in text and "9 members" in text
        await shot("5-preview", f"#{await card.get_attribute('id')}")
        await nothing_written()

        # 6. enabling switches it: the tier shows it in mention_only
        await card.locator("button.decide-button").click()
        await page.wait_for_selector(f"#tiers .tier-conversations:has-text('{cid}')", timeout=STEP)
        assert await page.locator("#tier-small").inner_text() == "enabled"
        head = expect(
            await svc.call("GET", f"/v1/conversations/{cid}", params={"min_position": svc.seen.position}), 200
        )
        assert head["write_policy"] == "mention_only"
        await shot("6-enabled", "#tiers-section")

        # 7. rollback, after a confirmation that says what it does
        await page.locator("#tiers button.rollback").click()
        confirm = await page.locator("#rollback-text").inner_text()
        assert "return to always" in confirm and "NOT backfilled" in confirm
        await page.fill("#rollback-reason", "browser test")
        await shot("7-rollback-confirmation", "#tiers-section")
        await page.click("#rollback-yes")
        await page.wait_for_selector(f"#tiers-message:has-text('returned to always: {cid}')", timeout=STEP)
        await page.wait_for_selector("#tier-small:has-text('disabled')", timeout=STEP)
        await page.wait_for_selector("#tier-history td:has-text('rolled back')", timeout=STEP)
        assert "browser test" in await page.locator("#tier-history").inner_text()
        await shot("8-rolled-back", "#tiers-section")

        # 8. re-review condition (1): T1 has held for FANOUT_REREVIEW_HOLD -> red, and a review is opened
        await page.wait_for_selector("#condition-1.red", timeout=STEP)
        await page.locator("form.review", has_text="rereview_1").wait_for(timeout=STEP)
        await shot("9-rereview-condition-1-red", "#rereview-section")
        await page.locator("#alpha-refresh").click()
        await page.locator(f"circle[data-cid='{cid}']").click()
        await page.wait_for_selector(f"#alpha-point:has-text('{cid}')", timeout=STEP)
        await shot("10-alpha", "#alpha-section")
        await page.fill("#cost-cid", cid)
        await page.fill("#cost-seq", "1")
        await page.click("#cost-form button")
        await page.wait_for_selector("#cost td:has-text('mailbox entries, O(N)')", timeout=STEP)
        await shot("11-message-cost", "#cost-section")
        assert not [e for e in errors if "Content Security Policy" in e], errors
        # condition 4's measure: the mailbox writes are timed where they happen (this process, or the
        # workers' heartbeats); 10-member groups write no fan-out big enough to judge the unit cost by
        four = expect(await admin.call("GET", "/v1/admin/rereview"), 200)["conditions"][1]
        assert four["details"]["measured_here"] and four["state"] == "unknown", four
    finally:
        stop.set()
        if load is not None:
            await load
        await context.close()
    print(f"browser story on {server.kind}: {time.monotonic() - started:.1f} s")


# Counts the console's polls as they render (each sets #capacity-updated, in the same task as
# every other table and the review cards): the test waits for the next one, never for a time.
COUNT_POLLS = """() => {
  window.renders = 0;
  new MutationObserver(() => { window.renders += 1; }).observe(document.getElementById("capacity-updated"), { childList: true });
}"""


async def test_the_consoles_refresh_keeps_what_the_reviewer_types_and_clicks(
    api: Api, server: Server, browser: Any
) -> None:
    """The console polls the API every second and redraws its tables. A review card being
    filled in must not notice: the focus stays in the field, the keystrokes after a poll land in
    it, and a click whose button goes down before a poll and up after it still counts (Preview,
    Decide, Roll back...). A whole-suite run lost a typed read_diffusion_min_saving and a Decide
    click this way: every poll took each open card out of the page and put it back."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    rid = expect(await api.admin(tenant).open_review(size_bucket="small"), 201)["review_id"]
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    try:
        await page.goto(server.url + "/console/")
        await page.fill("#token", mint_token(SECRET, tenant, "admin", "rita-reviewer"))
        await page.click("#token-form button")
        await page.wait_for_selector("#app:not([hidden])", timeout=STEP)
        card = page.locator(f"form.review[data-review-id='{rid}']")
        await card.wait_for(timeout=STEP)
        await page.evaluate(COUNT_POLLS)

        async def next_poll() -> None:
            seen = await page.evaluate("window.renders")
            await page.wait_for_function("seen => window.renders > seen", arg=seen, timeout=STEP)

        async def click_across_a_poll(selector: str) -> None:
            button = page.locator(selector)
            # at the top of the view: a table above that grows or shrinks does not move it
            await button.evaluate("b => b.scrollIntoView({ block: 'start' })")
            box = await button.bounding_box()
            assert box is not None, selector
            await page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            await page.mouse.down()
            await next_poll()
            await page.mouse.up()

        # typing: a poll between two keystrokes leaves the focus in the field and the text whole
        await card.locator("select.decision").select_option("enable_mention_only")
        min_saving, max_ratio = card.locator("input.min-saving"), card.locator("input.max-ratio")
        await min_saving.click()
        await page.keyboard.type("20")
        await next_poll()
        await page.keyboard.type("000")
        await page.keyboard.press("Tab")
        await page.keyboard.type("0.")
        await next_poll()
        await page.keyboard.type("05")
        assert await min_saving.input_value() == "20000"
        assert await max_ratio.input_value() == "0.05"
        assert await max_ratio.evaluate("e => e === document.activeElement")

        # clicks held across a poll: Preview, Decide (enables the tier), Roll back...
        card_id = await card.get_attribute("id")
        await click_across_a_poll(f"#{card_id} button.preview-button")
        await card.locator(".preview-summary, .form-error:not(:empty)").first.wait_for(timeout=STEP)
        assert await card.locator(".preview-summary").count() == 1, await card.locator(".form-error").inner_text()
        await click_across_a_poll(f"#{card_id} button.decide-button")
        await page.wait_for_selector("#tier-small:has-text('enabled')", timeout=STEP)
        await click_across_a_poll("#tiers button.rollback")
        await page.wait_for_selector("#rollback-confirm:not([hidden])", timeout=STEP)
        assert "return to always" in await page.locator("#rollback-text").inner_text()
    finally:
        await context.close()
