"""The write-policy state machine (SPEC section 4, ADR supplement 2026-08-14).

Pure functions: every input, including the clock, is passed in."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from domain.params import Parameters, WritePolicy


@dataclass(frozen=True)
class TierTerms:
    """What an approved review enabled for one scope (tenant x size bucket)."""

    enabled: bool
    read_diffusion_min_saving: float = 0.0
    read_diffusion_max_active_ratio: float = 0.0


DISABLED = TierTerms(enabled=False)


@dataclass(frozen=True)
class Switch:
    to: WritePolicy
    reason: str
    alpha: float
    n_eq: float


def is_active(last_active: float, now: float, window: float) -> bool:
    """A member is active if it sent or did MARK_READ within the window."""
    return last_active > 0.0 and last_active >= now - window


def alpha_of(last_active: Iterable[float], now: float, window: float) -> tuple[int, float]:
    """(member count, active member ratio)."""
    n = 0
    active = 0
    for t in last_active:
        n += 1
        if is_active(t, now, window):
            active += 1
    return n, (active / n if n else 0.0)


def equivalent_threshold(min_saving: float, alpha: float) -> float:
    """N_eq = min_saving / (1 - alpha): the old big_group_lazy_threshold, derived."""
    if alpha >= 1.0:
        return math.inf
    return min_saving / (1.0 - alpha)


def read_diffusion_saving(n: int, alpha: float) -> float:
    """Mailbox entries per message that mention_only would not write: N x (1 - alpha)."""
    return n * (1.0 - alpha)


def meets_enter_criterion(n: int, alpha: float, min_saving: float, max_active_ratio: float) -> bool:
    """The enter criterion (ADR supplement 1): N x (1 - alpha) > min_saving and alpha < max_active_ratio."""
    return read_diffusion_saving(n, alpha) > min_saving and alpha < max_active_ratio


def decide(
    policy: WritePolicy,
    tier: TierTerms,
    n: int,
    alpha: float,
    now: float,
    last_switch_at: float | None,
    params: Parameters,
) -> Switch | None:
    """The switch to make now, or None. Never switches from a metric alone:
    entering requires an enabled tier, which only an approved review makes."""
    n_eq = equivalent_threshold(tier.read_diffusion_min_saving, alpha) if tier.enabled else math.inf
    if policy is WritePolicy.MENTION_ONLY and not tier.enabled:
        # A tier rollback is a safety valve: immediate, not subject to the interval.
        return Switch(WritePolicy.ALWAYS, "tier_rollback", alpha, n_eq)
    interval_ok = last_switch_at is None or now - last_switch_at >= params.policy_switch_min_interval
    if not interval_ok:
        return None
    max_ratio = tier.read_diffusion_max_active_ratio
    if policy is WritePolicy.ALWAYS:
        if tier.enabled and meets_enter_criterion(n, alpha, tier.read_diffusion_min_saving, max_ratio):
            return Switch(WritePolicy.MENTION_ONLY, "alpha_criterion", alpha, n_eq)
        return None
    # Exit with hysteresis: N < 0.8 x N_eq, or alpha no longer below the ratio (supplement 3).
    if alpha >= max_ratio:
        return Switch(WritePolicy.ALWAYS, "active_ratio_exit", alpha, n_eq)
    if n < params.policy_switch_exit_ratio * n_eq:
        return Switch(WritePolicy.ALWAYS, "hysteresis_exit", alpha, n_eq)
    return None
