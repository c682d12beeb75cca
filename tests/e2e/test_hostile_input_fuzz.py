"""Fuzz-ish: hostile bodies and query strings against the real server.

Whatever arrives, the answer is a 2xx or a 4xx (never a 5xx), its body is strict JSON
(no NaN / Infinity literals), and a 4xx is the error body {"error", "message", "details"}.
Bodies: well-formed ones with one field replaced by junk (huge integers, floats, nested
containers, unicode with lone surrogates), raw text with NaN / Infinity / 1e999 spliced
in, truncated JSON, arbitrary bytes."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout.security import mint_token
from tests.e2e.conftest import SECRET, Server

# Hypothesis flags any change of the global `random` state during a draw; on the distributed
# runtime the Cassandra driver's threads (load balancing, reconnection) use it meanwhile.
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")

TENANT = "fuzz"
CID = "fuzz-room"
MEMBERS = ["ann", "bob"]

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same examples every run: a failure here is reproducible
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def strict_loads(raw: bytes) -> Any:
    def refuse(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(raw.decode("utf-8"), parse_constant=refuse)


class Raw:
    """Requests with exactly the bytes given, over one keep-alive connection."""

    def __init__(self, server: Server) -> None:
        url = urlsplit(server.url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)

    def call(self, method: str, path: str, token: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return resp.status, data
            except (ConnectionError, http.client.HTTPException):
                # the server may close a kept-alive connection; one fresh retry
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def assert_not_a_server_error(status: int, raw: bytes, what: object) -> None:
    assert status < 500, (status, raw[:500], what)
    assert 200 <= status < 500, (status, raw[:500], what)
    body = strict_loads(raw)  # strict JSON, whatever the status
    if status >= 400:
        assert isinstance(body, dict) and set(body) == {"error", "message", "details"}, (body, what)
        assert isinstance(body["error"], str) and isinstance(body["message"], str), body
        assert isinstance(body["details"], dict), body


@pytest.fixture(scope="module")
def raw(server: Server) -> Iterator[Raw]:
    client = Raw(server)
    svc = mint_token(SECRET, TENANT, "service", "svc")
    status, body = client.call(
        "POST", "/v1/conversations", svc, json.dumps({"conversation_id": CID, "members": MEMBERS}).encode()
    )
    assert status == 201, body
    status, body = client.call(
        "POST", f"/v1/conversations/{CID}/messages", svc, json.dumps({"sender": "ann", "text": "hi"}).encode()
    )
    assert status == 201, body
    yield client
    client.close()


def open_review(raw: Raw) -> str:
    admin = mint_token(SECRET, TENANT, "admin", "ops")
    status, body = raw.call("POST", "/v1/admin/reviews", admin, b'{"size_bucket": "large"}')
    assert status == 201, body
    return str(json.loads(body)["review_id"])


# -- strategies ---------------------------------------------------------------------

huge_ints = st.sampled_from([2**63, 2**64, 2**70, -(2**63) - 1, 10**30, 2**63 - 1, -1, 0])
hostile_text = st.text(st.characters(exclude_categories=()), max_size=20) | st.sampled_from(
    ["\ud800", "a\udfffb", "\x00", "\x7f", "x" * 200, "💬", "\u202e", ""]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | huge_ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | hostile_text
)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400", "nan", "inf"]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True)  # lone surrogates become \ud800 escapes


HOLE = "__non_finite__"
# What one field may hold, by kind (drawn first, so every kind is tried): junk of any shape,
# an integer at the 64-bit edge (alone or in a list), a raw NaN / Infinity literal, text
# with lone surrogates or control characters.
HOSTILE_KINDS: dict[str, st.SearchStrategy[Any]] = {
    "junk": junk,
    "int": st.integers(),
    "huge": huge_ints,
    "huge-in-list": huge_ints.map(lambda i: [i]),
    "non-finite": st.just(HOLE),
    "non-finite-in-list": st.just([HOLE]),
    "text": hostile_text,
    "texts": st.lists(hostile_text, max_size=3),
}


@st.composite
def spoiled_field(draw: st.DrawFn, valid: dict[str, Any], field: str) -> bytes:
    """The valid body with one field spoiled: the other fields pass validation, so a value
    that slips through reaches the domain and SQLite (where a 500 would come from)."""
    kind = draw(st.sampled_from(sorted(HOSTILE_KINDS)))
    body = {**valid, field: draw(HOSTILE_KINDS[kind])}
    text = dumps(body)
    if HOLE in text:
        text = text.replace(f'"{HOLE}"', draw(st.sampled_from(NON_FINITE)))
    return text.encode()


@st.composite
def spoiled_body(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    """A body that is wrong as a whole: junk, truncated, not JSON, bytes, deep nesting, an unknown key."""
    how = draw(st.sampled_from(["add", "whole", "truncate", "quotes", "bytes", "deep"]))
    if how == "add":
        return dumps({**valid, draw(hostile_text): draw(junk)}).encode()
    if how == "whole":
        return dumps(draw(junk)).encode()
    if how == "truncate":
        text = dumps(valid).encode()
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    if how == "quotes":
        return dumps(valid).replace('"', "'", draw(st.integers(1, 3))).encode()
    if how == "bytes":
        return draw(st.binary(max_size=64))
    depth = draw(st.integers(1, 3000))
    return (
        ("[" * depth + "]" * depth).encode() if draw(st.booleans()) else ('{"a":' * depth + "1" + "}" * depth).encode()
    )


Endpoint = tuple[str, str, str, str, dict[str, Any]]
ENDPOINTS: list[Endpoint] = [
    # (name, role, sub, path, a valid body)
    (
        "send",
        "service",
        "svc",
        f"/v1/conversations/{CID}/messages",
        {"sender": "ann", "text": "x", "mentions": ["bob"], "reply_to_seq": 1, "client_msg_id": "k"},
    ),
    ("create", "service", "svc", "/v1/conversations", {"conversation_id": "c", "title": "t", "members": ["ann"]}),
    ("members", "service", "svc", f"/v1/conversations/{CID}/members", {"user_ids": ["carol"]}),
    ("read", "user", "ann", f"/v1/me/conversations/{CID}/read", {"read_seq": 1}),
    (
        "decision",
        "admin",
        "ops",
        "/v1/admin/reviews/{review_id}/decision",
        {"decision": "enable_mention_only", "read_diffusion_min_saving": 1.0, "read_diffusion_max_active_ratio": 0.5},
    ),
    ("review", "admin", "ops", "/v1/admin/reviews", {"size_bucket": "small", "details": {"why": "fuzz"}}),
]
FIELDS = [(e, field) for e in ENDPOINTS for field in sorted(e[4])]


def post(raw: Raw, endpoint: Endpoint, body: bytes) -> None:
    _name, role, sub, path, _valid = endpoint
    if "{review_id}" in path:  # a fresh open review: a value that slips through would be stored
        path = path.format(review_id=open_review(raw))
    status, answer = raw.call("POST", path, mint_token(SECRET, TENANT, role, sub), body)
    assert_not_a_server_error(status, answer, body[:300])


@pytest.mark.parametrize(("endpoint", "field"), FIELDS, ids=[f"{e[0]}.{f}" for e, f in FIELDS])
@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_a_hostile_field_is_never_a_server_error_and_every_answer_is_strict_json(
    raw: Raw, endpoint: Endpoint, field: str, data: st.DataObject
) -> None:
    post(raw, endpoint, data.draw(spoiled_field(endpoint[4], field), label="body"))


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_a_hostile_body_is_never_a_server_error_and_every_answer_is_strict_json(
    raw: Raw, endpoint: Endpoint, data: st.DataObject
) -> None:
    post(raw, endpoint, data.draw(spoiled_body(endpoint[4]), label="body"))


query_values = (
    huge_ints.map(str)
    | st.integers().map(str)
    | hostile_text
    | st.sampled_from(["NaN", "Infinity", "1e3", "1.5", " 1", "0x10", "١٢", "+1", "-0"])
)


@FUZZ
@given(
    path=st.sampled_from(["/v1/me/mailbox", f"/v1/me/conversations/{CID}/messages"]),
    params=st.dictionaries(st.sampled_from(["after", "after_seq", "limit", "x"]), query_values, max_size=3),
)
def test_a_hostile_query_string_is_never_a_server_error(raw: Raw, path: str, params: dict[str, str]) -> None:
    token = mint_token(SECRET, TENANT, "user", "ann")
    query = "&".join(f"{quote(k)}={quote(v.encode('utf-8', 'surrogatepass'))}" for k, v in params.items())
    status, answer = raw.call("GET", f"{path}?{query}" if query else path, token)
    assert_not_a_server_error(status, answer, params)


@FUZZ
@given(seq=huge_ints.map(str) | query_values)
def test_a_hostile_delivery_seq_is_never_a_server_error(raw: Raw, seq: str) -> None:
    token = mint_token(SECRET, TENANT, "service", "svc")
    path = f"/v1/conversations/{CID}/messages/{quote(seq.encode('utf-8', 'surrogatepass'), safe='')}/delivery"
    status, answer = raw.call("GET", path, token)
    assert_not_a_server_error(status, answer, seq)
