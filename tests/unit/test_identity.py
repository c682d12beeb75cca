"""Identity rules (ADR-0008) against ids an attacker chooses: the tenant alphabet, the id
rule, the aggregate-name derivation, and tokens whose claims break them."""

from __future__ import annotations

import contextlib
import json
import string
import time
from typing import Any
from uuid import uuid5

import jwt
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cli.main import main as fanout_main
from domain import conversation, quota, tier
from domain.conversation import Conversation
from domain.errors import InvalidArgument
from domain.identity import MAX_ID_LENGTH, MAX_TENANT_LENGTH, TENANT_PATTERN, check_id, check_tenant, scoped_name
from domain.quota import TenantQuota
from domain.review import Review
from domain.tier import Tier
from fanout.security import InvalidClaim, Unauthenticated, mint_token, verify_token

SECRET = "unit-secret-" + "z" * 40
TENANT_CHARS = string.ascii_letters + string.digits + "._-"

tenants = st.from_regex(TENANT_PATTERN, fullmatch=True)
# Any code point except control characters (C0, DEL) and surrogates: what an id may hold.
id_chars = st.characters(exclude_categories=("Cs",)).filter(lambda c: c >= " " and c != "\x7f")
ids = st.text(id_chars, min_size=1, max_size=MAX_ID_LENGTH)
# What an attacker sends: anything, including '/', NUL, lone surrogates, very long.
anything = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=300),
    st.text(st.sampled_from(["/", "\x00", "\ud800", "\udfff", "\n", ".", "-", "a", "é", "\u202e"]), max_size=80),
)
forbidden_in_id = st.one_of(
    st.characters(min_codepoint=0, max_codepoint=0x1F),
    st.just("\x7f"),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
)


def later() -> int:
    return int(time.time()) + 3600


# -- tenants ---------------------------------------------------------------------------


@given(tenants)
def test_every_tenant_of_the_alphabet_is_accepted_as_is(tenant: str) -> None:
    assert check_tenant(tenant) == tenant
    assert "/" not in tenant and tenant.isascii() and 1 <= len(tenant) <= MAX_TENANT_LENGTH


@given(anything)
def test_a_tenant_is_accepted_only_when_it_is_in_the_alphabet(value: str) -> None:
    valid = 1 <= len(value) <= MAX_TENANT_LENGTH and value[0] in TENANT_CHARS[:62] and set(value) <= set(TENANT_CHARS)
    if valid:
        assert check_tenant(value) == value
    else:
        with pytest.raises(InvalidArgument) as info:
            check_tenant(value)
        assert info.value.details == {"field": "tenant"}
        json.dumps(info.value.message).encode("utf-8")  # the message never repeats the value


@pytest.mark.parametrize(
    "value",
    ["", "acme/x", "/acme", "acme/", "..", ".acme", "-acme", "_acme", "a" * 65, "acme\n", "ac me", "acmé", "ａcme",
     "acme\x00", "\ud800", None, 7, b"acme", ["acme"]],
)  # fmt: skip
def test_tenants_outside_the_alphabet_are_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument):
        check_tenant(value)


# -- ids -------------------------------------------------------------------------------


@given(ids)
def test_every_valid_id_is_accepted_as_is_and_encodes_as_utf8(value: str) -> None:
    assert check_id(value, "user_id") == value
    value.encode("utf-8")


@given(ids, forbidden_in_id, st.integers(min_value=0))
def test_an_id_holding_a_control_character_or_a_surrogate_is_refused(value: str, bad: str, at: int) -> None:
    at %= len(value) + 1
    with pytest.raises(InvalidArgument) as info:
        check_id(value[:at] + bad + value[at:], "user_id")
    assert info.value.details == {"field": "user_id"}


@given(anything)
def test_whatever_an_id_is_it_is_refused_or_storable(value: str) -> None:
    try:
        check_id(value, "conversation_id")
    except InvalidArgument:
        return
    assert 1 <= len(value) <= MAX_ID_LENGTH
    value.encode("utf-8")


@pytest.mark.parametrize("value", ["", "x" * (MAX_ID_LENGTH + 1), None, 7, "a\x00", "\ud800", "ok\udfff", "a\x7f"])
def test_ids_that_cannot_be_stored_are_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument):
        check_id(value, "user_id")


@pytest.mark.parametrize("value", ["x/secret", "../../etc", "é", "\u202egnp.exe", "a b", "\x80\x9f", "x" * 128])
def test_ids_may_hold_slashes_and_any_unicode_that_is_not_a_control_or_a_surrogate(value: str) -> None:
    assert check_id(value, "conversation_id") == value


# -- derivation ------------------------------------------------------------------------


@given(tenants, ids, tenants, ids)
def test_two_different_tenant_and_id_pairs_never_share_an_aggregate_name(t1: str, c1: str, t2: str, c2: str) -> None:
    assume((t1, c1) != (t2, c2))
    assert scoped_name("conversation", t1, c1) != scoped_name("conversation", t2, c2)
    assert Conversation.create_id(t1, c1) != Conversation.create_id(t2, c2)


@given(tenants, ids)
def test_aggregate_ids_of_valid_tenants_are_those_of_existing_data_dirs(tenant: str, cid: str) -> None:
    assert Conversation.create_id(tenant, cid) == uuid5(conversation.NAMESPACE, f"conversation/{tenant}/{cid}")
    assert Tier.create_id(tenant, "small") == uuid5(tier._NS, f"tier/{tenant}/small")
    assert TenantQuota.create_id(tenant) == uuid5(quota._NS, f"tenant-quota/{tenant}")


def test_the_issue_pair_can_no_longer_name_one_aggregate() -> None:
    """`acme/x` + `secret` used to be `acme` + `x/secret`: the first is no tenant now."""
    assert Conversation.create_id("acme", "x/secret") == uuid5(conversation.NAMESPACE, "conversation/acme/x/secret")
    for derive in (
        lambda: Conversation.create_id("acme/x", "secret"),
        lambda: Tier.create_id("acme/x", "small"),
        lambda: TenantQuota.create_id("acme/x"),
        lambda: Review(tenant="acme/x", size_bucket="small", trigger="T1", details={}, opened_by="x", at=0.0),
        lambda: Conversation(tenant="acme/x", conversation_id="secret", title="", at=0.0),
    ):
        with pytest.raises(InvalidArgument):
            derive()


@given(tenants, anything)
def test_a_conversation_id_that_is_not_an_id_derives_nothing(tenant: str, cid: str) -> None:
    try:
        check_id(cid, "conversation_id")
    except InvalidArgument:
        with pytest.raises(InvalidArgument):
            Conversation.create_id(tenant, cid)


# -- tokens ----------------------------------------------------------------------------


@given(tenants, ids, st.sampled_from(["user", "service", "admin"]))
def test_a_minted_token_of_valid_claims_verifies_to_them(tenant: str, sub: str, role: str) -> None:
    claims = verify_token(SECRET, mint_token(SECRET, tenant, role, sub))
    assert (claims.tenant, claims.sub, claims.role) == (tenant, sub, role)


@given(anything, anything)
def test_a_validly_signed_token_with_any_tenant_and_sub_verifies_only_when_both_are_valid(
    tenant: str, sub: str
) -> None:
    token = jwt.encode({"tenant": tenant, "sub": sub, "role": "user", "exp": later()}, SECRET, algorithm="HS256")
    # What the token says is its JSON text: a surrogate pair in a str is one code point there.
    said = json.loads(json.dumps({"tenant": tenant, "sub": sub}))
    if valid_claims(said["tenant"], said["sub"]):
        claims = verify_token(SECRET, token)
        assert (claims.tenant, claims.sub) == (said["tenant"], said["sub"])
    else:
        with pytest.raises(Unauthenticated) as info:
            verify_token(SECRET, token)
        info.value.message.encode("utf-8")
    with pytest.raises(InvalidClaim) if not valid_claims(tenant, sub) else contextlib.nullcontext():
        mint_token(SECRET, tenant, "user", sub)


def valid_claims(tenant: str, sub: str) -> bool:
    try:
        check_tenant(tenant)
        check_id(sub, "sub")
    except InvalidArgument:
        return False
    return True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@given(st.sampled_from(["exp", "iat", "nbf"]), json_values)
def test_a_time_claim_that_is_not_an_integer_time_is_unauthenticated(name: str, value: Any) -> None:
    claims: dict[str, Any] = {"tenant": "acme", "sub": "ann", "role": "user", "exp": later(), name: value}
    token = jwt.encode(claims, SECRET, algorithm="HS256")  # json.dumps: NaN / Infinity as they are
    now = time.time()
    in_range = type(value) is int and 0 <= value <= 253_402_300_799  # until the year 9999
    if in_range and (value > now if name == "exp" else value <= now):
        assert verify_token(SECRET, token).sub == "ann"
    else:
        with pytest.raises(Unauthenticated):
            verify_token(SECRET, token)


@pytest.mark.parametrize("exp", ["9999999999", 1e300, True, 9_999_999_999.0, float("inf"), float("nan"), 10**30, -1])
def test_exp_as_a_string_a_float_a_bool_or_out_of_range_is_unauthenticated(exp: Any) -> None:
    token = jwt.encode({"tenant": "acme", "sub": "ann", "role": "user", "exp": exp}, SECRET, algorithm="HS256")
    with pytest.raises(Unauthenticated, match="exp must be an integer"):
        verify_token(SECRET, token)


@given(st.text(st.characters(exclude_categories=()), min_size=1, max_size=50))
def test_a_token_with_non_ascii_characters_is_unauthenticated(token: str) -> None:
    assume(not token.isascii())
    with pytest.raises(Unauthenticated):
        verify_token(SECRET, token)


@given(st.text(max_size=400))
def test_any_other_text_as_a_token_is_unauthenticated(token: str) -> None:
    with pytest.raises(Unauthenticated):
        verify_token(SECRET, token.encode("ascii", "ignore").decode())


# -- fanout token ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--tenant", "acme/x"), ("--tenant", ""), ("--tenant", "\udcff"), ("--sub", "ann\udcff"), ("--sub", ""),
     ("--sub", "x" * 129), ("--ttl", "10000000d")],
)  # fmt: skip
def test_fanout_token_refuses_a_bad_claim_with_one_line(
    flag: str, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("FANOUT_SECRET", SECRET)
    args = {"--tenant": "acme", "--sub": "ann", "--ttl": "1h", flag: value}
    argv = ["token", "--role", "user", "--data-dir", str(tmp_path)] + [x for kv in args.items() for x in kv]
    assert fanout_main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("fanout: error:") and "Traceback" not in err
    err.encode("utf-8")
