"""TokenVerifier (ADR-0024): verify_token with the tokens it has verified remembered. What a
remembered token is allowed to skip is only what cannot change for the same string under the
same secret; time is checked on every call."""

from __future__ import annotations

import jwt
import pytest

from fanout.security import TokenVerifier, Unauthenticated, mint_token, verify_token

SECRET = "unit-secret-" + "v" * 40
NOW = 1_900_000_000


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_remembered_token_answers_the_same_claims_as_verify_token() -> None:
    clock = Clock(NOW)
    verify = TokenVerifier(SECRET, clock=clock)
    token = mint_token(SECRET, "acme", "service", "billing", ttl_seconds=60, now=NOW)
    first, again = verify(token), verify(token)
    assert first == again == verify_token(SECRET, token, now=NOW)


def test_a_remembered_token_is_refused_once_it_has_expired() -> None:
    clock = Clock(NOW)
    verify = TokenVerifier(SECRET, clock=clock)
    token = mint_token(SECRET, "acme", "service", "billing", ttl_seconds=60, now=NOW)
    verify(token)
    clock.now = NOW + 60
    with pytest.raises(Unauthenticated, match="expired"):
        verify(token)
    with pytest.raises(Unauthenticated, match="expired"):  # forgotten, and still refused
        verify(token)


def test_a_remembered_token_is_refused_before_its_iat_if_the_clock_steps_back() -> None:
    clock = Clock(NOW)
    verify = TokenVerifier(SECRET, clock=clock)
    token = mint_token(SECRET, "acme", "service", "billing", ttl_seconds=60, now=NOW)
    verify(token)
    clock.now = NOW - 1
    with pytest.raises(Unauthenticated, match="not valid yet"):
        verify(token)


def test_a_token_not_valid_yet_is_refused_and_accepted_once_its_nbf_has_passed() -> None:
    clock = Clock(NOW)
    verify = TokenVerifier(SECRET, clock=clock)
    claims = {"tenant": "acme", "sub": "billing", "role": "service", "exp": NOW + 60, "nbf": NOW + 10}
    token = jwt.encode(claims, SECRET, algorithm="HS256")
    with pytest.raises(Unauthenticated, match="not valid yet"):
        verify(token)
    clock.now = NOW + 10
    assert verify(token).sub == "billing"


def test_a_token_of_another_secret_or_a_forged_one_is_refused_every_time_and_never_kept() -> None:
    verify = TokenVerifier(SECRET, clock=Clock(NOW))
    other = mint_token("another-secret-" + "o" * 40, "acme", "service", "billing", ttl_seconds=60, now=NOW)
    forged = mint_token(SECRET, "acme", "service", "billing", ttl_seconds=60, now=NOW)[:-2] + "AA"
    for token in (other, forged, other, forged, "", "not a token"):
        with pytest.raises(Unauthenticated):
            verify(token)
    assert len(verify._verified) == 0


def test_at_most_max_tokens_are_kept_the_oldest_dropped_first() -> None:
    verify = TokenVerifier(SECRET, max_tokens=3, clock=Clock(NOW))
    tokens = [mint_token(SECRET, "acme", "user", f"u{i}", ttl_seconds=60, now=NOW) for i in range(5)]
    for token in tokens:
        assert verify(token).sub.startswith("u")
    assert list(verify._verified) == tokens[2:]
