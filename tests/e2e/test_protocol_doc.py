"""docs/PROTOCOL.md stays honest: its JSON examples are checked against a real server.

Every example in the doc is a fenced ```json block right after a marker line
`<!-- frame: NAME -->` (a WebSocket frame) or `<!-- http: NAME -->` (an HTTP body).
A scripted session sends the doc's client frames verbatim (only the token is replaced)
and captures one real frame of every server type; each doc example must have exactly
the keys (recursively, lists by their items) and JSON types of the real one. A field
added or removed on either side fails with the frame and the field named.

The doc's error-code table and mailbox-flag table are checked against api/errors.py
and domain/delivery.py the same way."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from api import schemas
from api.errors import STATUS
from domain import delivery as flags_module
from tests.e2e.conftest import QUIET_GROUP, Api, Socket, conversation, eventually, expect

DOC = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"
MARKED = re.compile(r"^<!-- (frame|http): ([A-Za-z_ /{}.]+?) -->\n+```json\n(.*?)^```", re.S | re.M)

CLIENT_FRAMES: dict[str, type[BaseModel]] = {"AUTH": schemas.AuthFrame, "MARK_READ": schemas.MarkReadFrame,
                 "PULL_HISTORY": schemas.PullHistoryFrame, "REBUILD": schemas.RebuildFrame}  # fmt: skip
SERVER_FRAMES = ("AUTH_OK", "SESSION_LIST_BATCH", "MESSAGE", "HEAD", "READ_OK", "HISTORY", "REBUILD_OK", "ERROR")
HTTP_BODIES = ("send", "send batch", "head", "delivery", "sessions", "mailbox", "error")

TENANT = "acme"
BIG, SMALL = "town-square", "team-a"  # the ids the doc's client frames use


def doc_examples() -> dict[str, Any]:
    """{"frame NAME" | "http NAME": parsed JSON} of every marked block of the doc."""
    text = DOC.read_text(encoding="utf-8")
    out: dict[str, Any] = {}
    for kind, name, body in MARKED.findall(text):
        key = f"{kind} {name}"
        assert key not in out, f"docs/PROTOCOL.md: two examples marked <!-- {kind}: {name} -->"
        try:
            out[key] = json.loads(body)
        except ValueError as exc:
            raise AssertionError(f"docs/PROTOCOL.md: the example <!-- {kind}: {name} --> is not JSON: {exc}") from None
    return out


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def shape_diff(doc: Any, real: Any, where: str) -> list[str]:
    """What differs between two JSON values in keys and types (not in values).
    null matches anything (an optional value); lists compare item by item."""
    if doc is None or real is None:
        return []
    if _kind(doc) != _kind(real):
        return [f"{where}: the doc has a {_kind(doc)}, the server sends a {_kind(real)} ({real!r})"]
    if isinstance(doc, dict):
        out = [f"{where}.{k}: sent by the server, missing from the doc" for k in sorted(set(real) - set(doc))]
        out += [f"{where}.{k}: in the doc, not sent by the server" for k in sorted(set(doc) - set(real))]
        for k in sorted(set(doc) & set(real)):
            out += shape_diff(doc[k], real[k], f"{where}.{k}")
        return out
    if isinstance(doc, list):
        out = []
        for i, (d, r) in enumerate(zip(doc, real, strict=False)):
            out += shape_diff(d, r, f"{where}[{i}]")
        return out
    return []


async def scripted_session(api: Api, doc: dict[str, Any]) -> dict[str, Any]:
    """One real example of every server frame and HTTP body the doc shows, keyed like
    doc_examples(). The client frames sent are the doc's own."""
    svc = await conversation(api, TENANT, BIG, QUIET_GROUP)  # ann + quiet0..quiet8
    real: dict[str, Any] = {}
    expect(await svc.send(BIG, sender="ann", text="welcome"), 201)
    await svc.materialized(BIG, 1)
    small = await conversation(api, TENANT, SMALL, ["ann", "quiet1", "bob"])
    real["http send"] = expect(
        await small.send(SMALL, sender="ann", text="standup in 5 @quiet1", mentions=["quiet1"], client_msg_id="a-1"),
        201,
    )
    await small.materialized(SMALL, 1)
    batch = [
        {"conversation_id": SMALL, "sender": "bob", "text": "on my way"},
        {"conversation_id": SMALL, "sender": "mallory", "text": "not a member"},
    ]
    real["http send batch"] = expect(await small.call("POST", "/v1/messages/batch", {"messages": batch}), 200)
    await small.materialized(SMALL, 2)
    # Enable the small tier: town-square (N=10, alpha=0.1: saving 9 > 5) switches to
    # mention_only; team-a (N=3: saving <= 3) stays in always.
    admin = api.admin(TENANT)
    rid = expect(await admin.open_review(size_bucket="small"), 201)["review_id"]
    decision = {"read_diffusion_min_saving": 5.0, "read_diffusion_max_active_ratio": 0.9}
    expect(await admin.decide(rid, decision="enable_mention_only", **decision), 200)
    await eventually(lambda: svc.head(BIG), lambda r: r.body["write_policy"] == "mention_only")
    assert expect(await small.head(SMALL), 200)["write_policy"] == "always"
    expect(await svc.send(BIG, sender="ann", text="@all town hall at 3", mention_all=True), 201)
    await svc.materialized(BIG, 2)

    quiet1 = api.user(TENANT, "quiet1")
    sock = await quiet1.socket(auth=False)
    await sock.send(**{**doc["frame AUTH"], "token": quiet1.token})
    real["frame AUTH_OK"] = await sock.expect("AUTH_OK")
    batches = await sock.session_list()
    real["frame SESSION_LIST_BATCH"] = batches[-1]

    expect(await svc.send(BIG, sender="ann", text="slides are in the wiki"), 201)
    real["frame MESSAGE"] = await sock.expect_live("MESSAGE", BIG, 3)  # materialized false: quiet1 is silent
    real["frame HEAD"] = await sock.expect("HEAD")
    real["http head"] = expect(await svc.head(BIG), 200)
    real["http delivery"] = await svc.materialized(BIG, 3)
    real["http sessions"] = expect(await quiet1.sessions(), 200)
    real["http mailbox"] = expect(await quiet1.mailbox(after=0, limit=2), 200)

    real["frame READ_OK"] = await _reply(sock, doc["frame MARK_READ"], "READ_OK")
    real["frame HISTORY"] = await _reply(sock, doc["frame PULL_HISTORY"], "HISTORY")
    real["frame REBUILD_OK"] = await _reply(sock, doc["frame REBUILD"], "REBUILD_OK")
    await sock.expect("SESSION_LIST_BATCH")  # the rebuilt conversation's fresh item
    real["frame ERROR"] = await _reply(sock, {**doc["frame MARK_READ"], "read_seq": 99}, "ERROR")
    await sock.close()
    real["http error"] = (await quiet1.read(BIG, 99)).body
    return real


async def _reply(sock: Socket, frame: dict[str, Any], expected: str) -> dict[str, Any]:
    await sock.send(**frame)
    return await sock.expect(expected)


async def test_every_example_in_the_protocol_doc_has_the_keys_the_server_sends(api: Api) -> None:
    doc = doc_examples()
    wanted = {f"frame {n}" for n in (*CLIENT_FRAMES, *SERVER_FRAMES)} | {f"http {n}" for n in HTTP_BODIES}
    assert not wanted - set(doc), f"docs/PROTOCOL.md lacks the examples {sorted(wanted - set(doc))}"
    assert not set(doc) - wanted, f"docs/PROTOCOL.md has examples this test does not check: {sorted(set(doc) - wanted)}"
    real = await scripted_session(api, doc)
    problems = []
    for key in sorted(real):
        problems += shape_diff(doc[key], real[key], key)
    # the doc shows a session with a flagged gap; an `always` session without one lacks exactly that key
    sessions = real["http sessions"]["sessions"]
    always = next(s for s in sessions if s["write_policy"] == "always")
    gapped = doc["frame SESSION_LIST_BATCH"]["sessions"][0]
    if set(gapped) - set(always) != {"delivered_conversation_seq"}:
        problems.append(f"sessions[] of an always conversation: keys {sorted(always)}")
    assert not problems, "docs/PROTOCOL.md and the server disagree:\n  " + "\n  ".join(problems)


def test_the_client_frames_of_the_doc_are_exactly_the_frame_schemas() -> None:
    doc = doc_examples()
    for name, model in CLIENT_FRAMES.items():
        example = doc[f"frame {name}"]
        assert example["type"] == name
        assert set(example) == set(model.model_fields), (
            f"frame {name}: doc {sorted(example)}, schema {sorted(model.model_fields)}"
        )
        model.model_validate(example)


def section(heading: str) -> str:
    """The doc's text under the heading line `heading` up to the next heading."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#)", text + "\n#", re.S | re.M)
    assert m is not None, f"docs/PROTOCOL.md has no heading {heading!r}"
    return m.group(1)


def test_the_error_codes_of_the_doc_are_the_servers_with_their_status() -> None:
    rows = re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) \|", section("Error codes"), re.M)
    doc = {code: int(status) for code, status in rows}
    problems = [f"{c}: api/errors.py {STATUS.get(c)}, docs/PROTOCOL.md {doc.get(c)}"
                for c in sorted(set(doc) | set(STATUS)) if doc.get(c) != STATUS.get(c)]  # fmt: skip
    assert not problems, "the error-code table of docs/PROTOCOL.md differs:\n  " + "\n  ".join(problems)


def test_the_mailbox_flags_of_the_doc_are_the_domain_constants() -> None:
    bits = {
        name: value
        for name, value in vars(flags_module).items()
        if name.isupper() and isinstance(value, int) and value & (value - 1) == 0 and value > 0
    }
    rows = re.findall(r"^\| `([A-Z_]+)` \| (\d+) \|", section("Mailbox entry flags"), re.M)
    doc = {name: int(v) for name, v in rows}
    assert doc == bits, f"the flags table of docs/PROTOCOL.md {doc} differs from domain/delivery.py {bits}"
