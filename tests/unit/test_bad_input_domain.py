"""Bad input is refused with its domain error, and nothing is appended to the event store.

Driven through FanoutApplication on the real SQLite event store (the embedded runtime),
comparing the recorder's max_notification_id before and after each refused command."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.errors import (
    AlreadyExists,
    Conflict,
    FanoutError,
    GroupFull,
    InvalidArgument,
    NotAMember,
    NotFound,
    ReviewRequired,
)
from domain.params import Parameters
from domain.review import Review
from domain.tier import Tier
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from fanout.embedded import EmbeddedRuntime

T = "t1"
PARAMS = Parameters(max_group_members=12, small_max_members=4, medium_max_members=8, max_text_length=100)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[EmbeddedRuntime]:
    clock = Clock()
    rt = bootstrap(Settings.embedded(tmp_path / "data", PARAMS), clock=clock)
    rt.clock_obj = clock  # type: ignore[attr-defined]
    try:
        yield rt
    finally:
        rt.close()


def log_top(rt: EmbeddedRuntime) -> int:
    return rt.app.recorder.max_notification_id() or 0  # type: ignore[attr-defined]


def refused(rt: EmbeddedRuntime, error: type[FanoutError], command: Callable[[], Any]) -> FanoutError:
    """Run `command`, expect `error`, and prove the event store did not change."""
    before = log_top(rt)
    with pytest.raises(error) as info:
        command()
    assert log_top(rt) == before, "a refused command appended to the event store"
    assert info.value.code == error.code
    return info.value


def members(n: int) -> list[str]:
    return [f"u{i}" for i in range(n)]


@pytest.fixture
def conv(runtime: EmbeddedRuntime) -> str:
    runtime.app.create_conversation(T, "c", "title", members(3))
    runtime.clock_obj.now += 1  # type: ignore[attr-defined]
    runtime.app.send_message(T, "c", sender="u0", text="first")
    runtime.clock_obj.now += 10  # type: ignore[attr-defined]
    return "c"


# -- membership ------------------------------------------------------------------


def test_joining_past_max_group_members_is_group_full_and_writes_nothing(runtime, conv):
    runtime.app.add_members(T, conv, members(12))  # exactly full: allowed
    assert len(runtime.app.conversation(T, conv).members) == 12
    err = refused(runtime, GroupFull, lambda: runtime.app.add_members(T, conv, ["x1"]))
    assert err.details["max_group_members"] == 12
    assert len(runtime.app.conversation(T, conv).members) == 12


def test_a_bulk_join_that_would_overflow_adds_none_of_its_members(runtime, conv):
    refused(runtime, GroupFull, lambda: runtime.app.add_members(T, conv, [f"n{i}" for i in range(10)]))
    assert sorted(runtime.app.conversation(T, conv).members) == members(3)
    # existing members do not count twice, duplicates in the request count once
    runtime.app.add_members(T, conv, [*members(3), *[f"n{i}" for i in range(9)], "n0", "n0"])
    assert len(runtime.app.conversation(T, conv).members) == 12


def test_creating_a_conversation_over_max_group_members_creates_nothing(runtime):
    refused(runtime, GroupFull, lambda: runtime.app.create_conversation(T, "big", "", members(13)))
    refused(runtime, NotFound, lambda: runtime.app.conversation(T, "big"))
    runtime.app.create_conversation(T, "big", "", members(12))
    assert len(runtime.app.conversation(T, "big").members) == 12


def test_creating_a_conversation_twice_is_already_exists(runtime, conv):
    refused(runtime, AlreadyExists, lambda: runtime.app.create_conversation(T, conv, "", []))


@pytest.mark.parametrize("user_id", ["", "x" * 129, 7, None, "bad\nid"])
def test_a_malformed_user_id_is_refused_on_join(runtime, conv, user_id):
    refused(runtime, InvalidArgument, lambda: runtime.app.add_members(T, conv, [user_id]))


def test_removing_a_non_member_is_not_a_member(runtime, conv):
    refused(runtime, NotAMember, lambda: runtime.app.remove_member(T, conv, "stranger"))


def test_commands_on_an_unknown_conversation_are_not_found(runtime):
    refused(runtime, NotFound, lambda: runtime.app.add_members(T, "nope", ["a"]))
    refused(runtime, NotFound, lambda: runtime.app.send_message(T, "nope", sender="a", text="x"))
    refused(runtime, NotFound, lambda: runtime.app.mark_read(T, "nope", "a", 0))


def test_another_tenant_cannot_reach_a_conversation(runtime, conv):
    refused(runtime, NotFound, lambda: runtime.app.send_message("t2", conv, sender="u0", text="x"))


# -- sending ---------------------------------------------------------------------


def test_a_sender_that_is_not_a_member_is_refused(runtime, conv):
    refused(runtime, NotAMember, lambda: runtime.app.send_message(T, conv, sender="stranger", text="hi"))


def test_a_sender_that_left_is_refused(runtime, conv):
    runtime.app.remove_member(T, conv, "u1")
    refused(runtime, NotAMember, lambda: runtime.app.send_message(T, conv, sender="u1", text="hi"))


@pytest.mark.parametrize("text", ["", None, 42, "x" * 101])
def test_empty_oversized_or_non_text_is_refused(runtime, conv, text):
    refused(runtime, InvalidArgument, lambda: runtime.app.send_message(T, conv, sender="u1", text=text))


def test_text_of_exactly_max_length_is_accepted(runtime, conv):
    assert runtime.app.send_message(T, conv, sender="u1", text="x" * 100)["conversation_seq"] == 2


@pytest.mark.parametrize("reply_to_seq", [0, -1, 2, 10**9])
def test_reply_to_seq_out_of_range_is_refused(runtime, conv, reply_to_seq):
    refused(
        runtime,
        InvalidArgument,
        lambda: runtime.app.send_message(T, conv, sender="u1", text="re", reply_to_seq=reply_to_seq),
    )


@pytest.mark.parametrize("reply_to_seq", [True, "1", 1.0])
def test_reply_to_seq_that_is_not_an_integer_is_invalid_argument(runtime, conv, reply_to_seq):
    refused(
        runtime,
        InvalidArgument,
        lambda: runtime.app.send_message(T, conv, sender="u1", text="re", reply_to_seq=reply_to_seq),
    )


def test_a_refused_send_does_not_consume_a_seq(runtime, conv):
    refused(runtime, InvalidArgument, lambda: runtime.app.send_message(T, conv, sender="u1", text=""))
    assert runtime.app.send_message(T, conv, sender="u1", text="ok")["conversation_seq"] == 2


# -- reading ---------------------------------------------------------------------


@pytest.mark.parametrize("read_seq", [-1, 2, 10**9, True, "1", 1.5, None])
def test_read_seq_negative_future_or_not_an_integer_is_refused(runtime, conv, read_seq):
    refused(runtime, InvalidArgument, lambda: runtime.app.mark_read(T, conv, "u1", read_seq))


def test_mark_read_by_a_non_member_is_refused(runtime, conv):
    refused(runtime, NotAMember, lambda: runtime.app.mark_read(T, conv, "stranger", 1))


def test_rebuild_by_a_non_member_is_refused(runtime, conv):
    refused(runtime, NotAMember, lambda: runtime.app.request_rebuild(T, conv, "stranger"))


# -- reviews and tiers -----------------------------------------------------------


def open_review(rt: EmbeddedRuntime, bucket: str = "small") -> str:
    return str(rt.app.open_review(T, bucket, "manual", {}, "admin")["review_id"])


def test_a_review_decided_twice_is_a_conflict(runtime):
    rid = open_review(runtime)
    runtime.app.decide_review(T, rid, "no_action", "admin")
    refused(runtime, Conflict, lambda: runtime.app.decide_review(T, rid, "enable_mention_only", "admin", 1.0, 0.5))
    assert runtime.app.tier_terms(T, "small").enabled is False


@pytest.mark.parametrize(
    ("min_saving", "ratio"),
    [(None, 0.5), (1.0, None), (0.0, 0.5), (-1.0, 0.5), (1.0, 0.0), (1.0, 1.5)],
)
def test_enable_mention_only_without_valid_alpha_parameters_is_refused_and_leaves_the_review_open(
    runtime, min_saving, ratio
):
    rid = open_review(runtime)
    refused(runtime, InvalidArgument, lambda: runtime.app.decide_review(T, rid, "enable_mention_only", "a", min_saving, ratio))
    assert runtime.app.review(T, rid).status == "open"
    assert runtime.app.tier_terms(T, "small").enabled is False


def test_an_unknown_decision_trigger_or_size_bucket_is_refused(runtime):
    rid = open_review(runtime)
    refused(runtime, InvalidArgument, lambda: runtime.app.decide_review(T, rid, "switch_everything", "a"))
    refused(runtime, InvalidArgument, lambda: runtime.app.open_review(T, "huge", "manual", {}, "a"))
    refused(runtime, InvalidArgument, lambda: runtime.app.open_review(T, "small", "T9", {}, "a"))


def test_a_review_of_another_tenant_is_not_found(runtime):
    rid = open_review(runtime)
    refused(runtime, NotFound, lambda: runtime.app.decide_review("t2", rid, "enable_mention_only", "a", 1.0, 0.5))
    refused(runtime, NotFound, lambda: runtime.app.decide_review(T, "not-a-uuid", "no_action", "a"))


def test_rolling_back_a_tier_that_was_never_enabled_is_refused(runtime):
    refused(runtime, NotFound, lambda: runtime.app.roll_back_tier(T, "small", "admin", "why"))


def test_rolling_back_a_disabled_tier_is_a_conflict(runtime):
    rid = open_review(runtime)
    runtime.app.decide_review(T, rid, "enable_mention_only", "admin", 1.0, 0.5)
    runtime.app.roll_back_tier(T, "small", "admin", "why")
    refused(runtime, Conflict, lambda: runtime.app.roll_back_tier(T, "small", "admin", "again"))


def make_review(decision: str | None, bucket: str = "small", tenant: str = T) -> Review:
    review = Review(tenant=tenant, size_bucket=bucket, trigger="T1", details={}, opened_by="x", at=0.0)
    if decision == "enable_mention_only":
        review.decide(decision, "admin", 1.0, read_diffusion_min_saving=10.0, read_diffusion_max_active_ratio=0.5)
    elif decision is not None:
        review.decide(decision, "admin", 1.0)
    return review


@pytest.mark.parametrize(
    "review",
    [
        make_review(None),
        make_review("no_action"),
        make_review("scale_out"),
        make_review("rate_limit"),
        make_review("enable_mention_only", bucket="medium"),
        make_review("enable_mention_only", tenant="t2"),
    ],
    ids=["open", "no_action", "scale_out", "rate_limit", "other_bucket", "other_tenant"],
)
def test_a_tier_is_enabled_only_by_an_approved_review_of_its_own_scope(review):
    tier = Tier(tenant=T, size_bucket="small")
    pending = len(tier.collect_events())
    with pytest.raises(ReviewRequired):
        tier.enable(review, now=2.0)
    assert tier.enabled is False
    assert tier.collect_events() == [] and pending == 1


def test_an_approved_review_of_its_own_scope_enables_the_tier():
    tier = Tier(tenant=T, size_bucket="small")
    tier.enable(make_review("enable_mention_only"), now=2.0)
    assert tier.terms().enabled and tier.terms().read_diffusion_min_saving == 10.0


def test_an_application_that_refused_a_command_still_serves_the_next_one(runtime, conv):
    """A half-applied command never leaks into the next one (the aggregate cache is evicted)."""
    refused(runtime, GroupFull, lambda: runtime.app.add_members(T, conv, [f"n{i}" for i in range(20)]))
    refused(runtime, InvalidArgument, lambda: runtime.app.send_message(T, conv, sender="u0", text=""))
    runtime.clock_obj.now += 10  # type: ignore[attr-defined]
    out = runtime.app.send_message(T, conv, sender="u2", text="still fine")
    assert out["conversation_seq"] == 2
    assert sorted(runtime.app.conversation(T, conv).members) == members(3)
