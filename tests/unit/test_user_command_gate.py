"""The per-user command gate (ADR-0009), the MARK_READ coalescing rule and their settings."""

from __future__ import annotations

import pytest

from domain.conversation import READ_ACTIVITY_REFRESH, Conversation
from domain.errors import InvalidArgument, NotAMember, RateLimited
from domain.params import Parameters, Rate
from domain.quota import TenantQuota
from fanout.config import ConfigError, load_settings
from fanout.gate import GATE, UserCommandGate

NOW = 1_700_000_000.0


def test_a_user_gets_the_burst_then_one_command_per_refill_and_others_are_unaffected() -> None:
    gate = UserCommandGate(Parameters(per_user_command_rate=Rate(5, 1.0), per_user_command_burst=3))
    for _ in range(3):
        gate.admit("t", "bob", NOW)
    with pytest.raises(RateLimited) as refused:
        gate.admit("t", "bob", NOW)
    assert refused.value.details["gate"] == GATE == "per_user_command_rate"
    assert refused.value.details["retry_after_ms"] == 201  # 1/5 s, rounded up + 1 ms
    gate.admit("t", "ann", NOW)  # another user
    gate.admit("u", "bob", NOW)  # the same user id in another tenant
    gate.admit("t", "bob", NOW + 0.2)  # one token refilled
    with pytest.raises(RateLimited):
        gate.admit("t", "bob", NOW + 0.2)


def test_a_refused_command_spends_nothing() -> None:
    gate = UserCommandGate(Parameters(per_user_command_rate=Rate(1, 1.0), per_user_command_burst=1))
    gate.admit("t", "bob", NOW)
    for _ in range(10):
        with pytest.raises(RateLimited):
            gate.admit("t", "bob", NOW + 0.5)
    gate.admit("t", "bob", NOW + 1.0)


def test_full_buckets_are_forgotten_past_the_bound() -> None:
    gate = UserCommandGate(Parameters())
    gate.MAX_BUCKETS = 10
    for i in range(11):
        gate.admit("t", f"u{i}", NOW)
    gate.admit("t", "late", NOW + 60)  # everyone else is full again by now
    assert set(gate._buckets) == {("t", "late")}


def conversation_with_bob(read_at: float | None) -> Conversation:
    conv = Conversation(tenant="t", conversation_id="c", title="", at=NOW)
    conv.join(["ann", "bob"], NOW, Parameters())
    if read_at is not None:
        conv.mark_read("bob", 0, read_at)
    return conv


def test_mark_read_changes_nothing_only_when_not_ahead_and_activity_is_recent() -> None:
    p = Parameters()
    refresh = p.activity_window * READ_ACTIVITY_REFRESH
    conv = conversation_with_bob(read_at=NOW)
    assert conv.read_changes_nothing("bob", 0, 0, NOW + refresh / 2, p)
    assert not conv.read_changes_nothing("bob", 0, None, NOW, p)  # the views do not know bob yet
    assert not conv.read_changes_nothing("bob", 0, 0, NOW + refresh, p)  # activity to refresh
    never_active = conversation_with_bob(read_at=None)
    assert not never_active.read_changes_nothing("bob", 0, 0, NOW, p)  # first activity is news


def test_a_read_ahead_of_the_views_is_never_coalesced_and_bad_reads_are_still_refused() -> None:
    p = Parameters()
    conv = conversation_with_bob(read_at=NOW)
    quota_free = Parameters(tenant_fanout_quota_capacity=1e9)
    conv.send(sender="ann", text="x", message_id="m1", quota=TenantQuota(tenant="t"), params=quota_free, now=NOW)
    assert not conv.read_changes_nothing("bob", 1, 0, NOW, p)
    assert conv.read_changes_nothing("bob", 1, 1, NOW, p)
    with pytest.raises(InvalidArgument):
        conv.read_changes_nothing("bob", 2, 5, NOW, p)  # beyond latest, whatever the views say
    with pytest.raises(NotAMember):
        conv.read_changes_nothing("cat", 0, 0, NOW, p)


def test_the_gate_and_the_fresh_read_wait_are_settings() -> None:
    params = load_settings(
        {
            "FANOUT_PER_USER_COMMAND_RATE": "2/1s",
            "FANOUT_PER_USER_COMMAND_BURST": "4",
            "FANOUT_FRESH_READ_TIMEOUT": "750ms",
        }
    ).params
    assert params.per_user_command_rate == Rate(2, 1.0) and params.per_user_command_burst == 4
    assert params.fresh_read_timeout == 0.75
    defaults = Parameters()
    assert defaults.per_user_command_rate == Rate(5, 1.0) and defaults.per_user_command_burst == 10
    for key, bad in (("FANOUT_PER_USER_COMMAND_BURST", "0.5"), ("FANOUT_PER_USER_COMMAND_RATE", "fast")):
        with pytest.raises(ConfigError, match=key):
            load_settings({key: bad})
