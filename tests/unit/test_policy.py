"""Property tests of the write-policy state machine `decide` (SPEC section 4, invariant H)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from domain.params import Parameters, WritePolicy
from domain.policy import DISABLED, TierTerms, alpha_of, decide, equivalent_threshold, is_active

PARAMS = Parameters(policy_switch_min_interval=86_400.0, policy_switch_exit_ratio=0.8)

policies = st.sampled_from(list(WritePolicy))
sizes = st.integers(min_value=0, max_value=200_000)
alphas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
times = st.floats(min_value=0.0, max_value=4e9, allow_nan=False)
min_savings = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)
ratios = st.floats(min_value=0.001, max_value=1.0, allow_nan=False)
enabled_tiers = st.builds(TierTerms, enabled=st.just(True), read_diffusion_min_saving=min_savings,
                          read_diffusion_max_active_ratio=ratios)
any_tiers = st.one_of(st.just(DISABLED), enabled_tiers)


@st.composite
def n_and_alpha(draw: st.DrawFn) -> tuple[int, float]:
    """A member count and an alpha that a real conversation can have (active / n)."""
    n = draw(st.integers(min_value=0, max_value=100_000))
    active = draw(st.integers(min_value=0, max_value=n))
    return n, (active / n if n else 0.0)


def last_switches(now: float) -> st.SearchStrategy[float | None]:
    return st.one_of(st.none(), st.floats(min_value=0.0, max_value=now, allow_nan=False))


def interval_ok(now: float, last: float | None) -> bool:
    return last is None or now - last >= PARAMS.policy_switch_min_interval


@given(policy=policies, na=n_and_alpha(), now=times, data=st.data())
def test_decide_never_enters_mention_only_with_a_disabled_tier(policy, na, now, data):
    n, alpha = na
    switch = decide(policy, DISABLED, n, alpha, now, data.draw(last_switches(now)), PARAMS)
    assert switch is None or switch.to is WritePolicy.ALWAYS


@given(tier=enabled_tiers, na=n_and_alpha(), now=times, data=st.data())
def test_decide_enters_iff_saving_exceeds_min_saving_and_alpha_below_ratio_and_interval_ok(tier, na, now, data):
    n, alpha = na
    last = data.draw(last_switches(now))
    switch = decide(WritePolicy.ALWAYS, tier, n, alpha, now, last, PARAMS)
    expected = (
        n * (1 - alpha) > tier.read_diffusion_min_saving
        and alpha < tier.read_diffusion_max_active_ratio
        and interval_ok(now, last)
    )
    assert (switch is not None) == expected
    if switch is not None:
        assert switch.to is WritePolicy.MENTION_ONLY


@given(policy=policies, tier=any_tiers, na=n_and_alpha(), now=times, data=st.data())
def test_decide_from_always_only_ever_switches_to_mention_only(policy, tier, na, now, data):
    n, alpha = na
    switch = decide(WritePolicy.ALWAYS, tier, n, alpha, now, data.draw(last_switches(now)), PARAMS)
    assert switch is None or switch.to is WritePolicy.MENTION_ONLY


@given(tier=enabled_tiers, na=n_and_alpha(), now=times, data=st.data())
def test_decide_exits_iff_n_below_exit_ratio_of_n_eq_or_alpha_at_ratio_and_interval_ok(tier, na, now, data):
    n, alpha = na
    last = data.draw(last_switches(now))
    switch = decide(WritePolicy.MENTION_ONLY, tier, n, alpha, now, last, PARAMS)
    n_eq = tier.read_diffusion_min_saving / (1 - alpha) if alpha < 1 else math.inf
    expected = interval_ok(now, last) and (
        alpha >= tier.read_diffusion_max_active_ratio or n < PARAMS.policy_switch_exit_ratio * n_eq
    )
    assert (switch is not None) == expected
    if switch is not None:
        assert switch.to is WritePolicy.ALWAYS
        assert switch.reason in ("active_ratio_exit", "hysteresis_exit")


@st.composite
def entering(draw: st.DrawFn) -> tuple[TierTerms, int, float]:
    """An enabled tier and an (n, alpha) that meets its enter criterion."""
    n = draw(st.integers(min_value=1, max_value=100_000))
    active = draw(st.integers(min_value=0, max_value=n - 1))
    alpha = active / n
    saving = n * (1 - alpha)
    min_saving = draw(st.floats(min_value=0.0, max_value=saving, exclude_min=True, exclude_max=True))
    ratio = draw(st.floats(min_value=alpha, max_value=1.0, exclude_min=True))
    return TierTerms(True, min_saving, ratio), n, alpha


@given(case=entering(), now=times, data=st.data())
def test_a_conversation_just_entered_does_not_exit_at_the_same_n_and_alpha(case, now, data):
    tier, n, alpha = case
    earlier = st.floats(min_value=0.0, max_value=now - PARAMS.policy_switch_min_interval)
    last = data.draw(st.one_of(st.none(), earlier) if now >= PARAMS.policy_switch_min_interval else st.none())
    assert decide(WritePolicy.ALWAYS, tier, n, alpha, now, last, PARAMS) is not None
    # Not at once (interval), and not even once the interval has passed (hysteresis).
    assert decide(WritePolicy.MENTION_ONLY, tier, n, alpha, now, now, PARAMS) is None
    later = now + PARAMS.policy_switch_min_interval
    assert decide(WritePolicy.MENTION_ONLY, tier, n, alpha, later, now, PARAMS) is None
    assert decide(WritePolicy.MENTION_ONLY, tier, n, alpha, later, None, PARAMS) is None


@given(tier=enabled_tiers, na=n_and_alpha(), now=times, since=st.floats(min_value=0.0, max_value=86_399.0))
def test_no_switch_either_way_within_the_min_interval_while_the_tier_is_enabled(tier, na, now, since):
    n, alpha = na
    for policy in WritePolicy:
        assert decide(policy, tier, n, alpha, now, now - since, PARAMS) is None


@given(na=n_and_alpha(), now=times, data=st.data())
def test_tier_rollback_returns_mention_only_to_always_immediately_whatever_the_interval(na, now, data):
    n, alpha = na
    last = data.draw(st.one_of(st.none(), st.just(now), last_switches(now)))
    switch = decide(WritePolicy.MENTION_ONLY, DISABLED, n, alpha, now, last, PARAMS)
    assert switch is not None
    assert switch.to is WritePolicy.ALWAYS
    assert switch.reason == "tier_rollback"


@given(na=n_and_alpha(), now=times, data=st.data())
def test_a_disabled_tier_never_switches_an_always_conversation(na, now, data):
    n, alpha = na
    assert decide(WritePolicy.ALWAYS, DISABLED, n, alpha, now, data.draw(last_switches(now)), PARAMS) is None


@given(min_saving=min_savings, alpha=st.floats(min_value=0.0, max_value=0.999, allow_nan=False))
def test_n_eq_is_min_saving_over_one_minus_alpha(min_saving, alpha):
    assert math.isclose(equivalent_threshold(min_saving, alpha), min_saving / (1 - alpha))


def test_n_eq_is_infinite_when_every_member_is_active():
    assert equivalent_threshold(10.0, 1.0) == math.inf


@given(
    last=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    now=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    window=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
)
def test_a_member_is_active_iff_it_acted_within_the_window(last, now, window):
    assert is_active(last, now, window) == (last > 0.0 and last >= now - window)


def test_a_member_that_never_acted_is_never_active():
    assert not is_active(0.0, 5.0, 1e9)


@given(st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), max_size=50))
def test_alpha_is_the_share_of_active_members(last_active):
    n, alpha = alpha_of(last_active, 100.0, 10.0)
    assert n == len(last_active)
    active = sum(1 for t in last_active if t > 0 and t >= 90.0)
    assert alpha == (active / n if n else 0.0)
