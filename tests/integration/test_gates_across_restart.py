"""Admission gates survive a restart (ADR-0005): a reopened process hands out no
fresh burst. Real SQLite event store on disk, fake clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from domain.errors import FanoutQuotaExceeded, RateLimited
from domain.params import Parameters, Rate
from fanout.bootstrap import bootstrap
from fanout.config import Settings

T0 = 1_700_000_000.0


def test_the_conversation_bucket_is_not_refilled_by_a_restart(tmp_path: Path) -> None:
    clock = [T0]
    params = dataclasses.replace(Parameters(), rate_small=3, per_sender_in_conversation_rate=Rate(100, 1.0))
    with bootstrap(Settings.embedded(tmp_path, params), clock=lambda: clock[0]) as rt:
        rt.app.create_conversation("acme", "g", "", ["a", "b"])
        for _ in range(3):  # the whole burst: capacity 3
            rt.app.send_message("acme", "g", sender="a", text="x")
        with pytest.raises(RateLimited):
            rt.app.send_message("acme", "g", sender="a", text="x")
    with bootstrap(Settings.embedded(tmp_path, params), clock=lambda: clock[0]) as rt:
        with pytest.raises(RateLimited) as info:
            rt.app.send_message("acme", "g", sender="b", text="after restart")
        assert info.value.details["gate"] == "per_conversation_msg_rate"
        clock[0] += info.value.details["retry_after_ms"] / 1000
        assert rt.app.send_message("acme", "g", sender="b", text="later")["conversation_seq"] == 4


def test_the_sender_bucket_is_not_refilled_by_a_restart(tmp_path: Path) -> None:
    clock = [T0]
    with bootstrap(Settings.embedded(tmp_path), clock=lambda: clock[0]) as rt:
        rt.app.create_conversation("acme", "g", "", ["a", "b"])
        rt.app.send_message("acme", "g", sender="a", text="x")
    clock[0] += 1.0
    with bootstrap(Settings.embedded(tmp_path), clock=lambda: clock[0]) as rt:
        with pytest.raises(RateLimited) as info:
            rt.app.send_message("acme", "g", sender="a", text="too soon")
        assert info.value.details["gate"] == "per_sender_in_conversation_rate"
        assert 1_990 <= info.value.details["retry_after_ms"] <= 2_002


def test_the_tenant_fanout_quota_is_not_refilled_by_a_restart(tmp_path: Path) -> None:
    clock = [T0]
    params = dataclasses.replace(
        Parameters(),
        tenant_fanout_quota_capacity=10,
        tenant_fanout_quota_refill_per_sec=1,
        per_sender_in_conversation_rate=Rate(100, 1.0),
    )
    with bootstrap(Settings.embedded(tmp_path, params), clock=lambda: clock[0]) as rt:
        rt.app.create_conversation("acme", "g", "", ["a", "b", "c", "d", "e"])
        rt.app.send_message("acme", "g", sender="a", text="5 entries")
        rt.app.send_message("acme", "g", sender="b", text="5 entries")
    with bootstrap(Settings.embedded(tmp_path, params), clock=lambda: clock[0]) as rt:
        with pytest.raises(FanoutQuotaExceeded) as info:
            rt.app.send_message("acme", "g", sender="c", text="would need 5 more")
        assert info.value.details["entries"] == 5
        assert 5_000 <= info.value.details["retry_after_ms"] <= 5_002
        log_before = rt.app.recorder.max_notification_id()
    with bootstrap(Settings.embedded(tmp_path, params), clock=lambda: clock[0]) as rt:
        assert rt.app.recorder.max_notification_id() == log_before  # the rejection wrote nothing
