"""The command side checks the tenant of everything it loads (ADR-0008): a tenant outside
the alphabet is refused before anything is loaded, and an aggregate of another tenant (or
of another kind) under the id a command derived is NotFound, never acted on.

Driven through FanoutApplication on the real SQLite event store; every refused command
leaves the event store exactly as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from domain.conversation import Conversation
from domain.errors import FanoutError, InvalidArgument, NotFound
from domain.params import Parameters
from domain.quota import TenantQuota
from domain.tier import Tier
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from fanout.embedded import EmbeddedRuntime

PARAMS = Parameters(max_group_members=50, small_max_members=10, medium_max_members=20)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 5.0  # every command is the sender's next admissible one
        return self.now


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[EmbeddedRuntime]:
    runtime = bootstrap(Settings.embedded(tmp_path / "data", PARAMS), clock=Clock())
    try:
        runtime.app.create_conversation("acme", "x/secret", "acme's", ["ann", "bob"])
        runtime.app.send_message("acme", "x/secret", sender="ann", text="for acme only")
        yield runtime
    finally:
        runtime.close()


def log_top(rt: EmbeddedRuntime) -> int:
    return rt.app.recorder.max_notification_id() or 0  # type: ignore[attr-defined]


def state(rt: EmbeddedRuntime) -> tuple[Any, ...]:
    conv = rt.app.conversation("acme", "x/secret")
    return log_top(rt), conv.version, dict(conv.members), conv.seq


def refused(rt: EmbeddedRuntime, error: type[FanoutError], command: Callable[[], Any]) -> None:
    before = state(rt)
    with pytest.raises(error):
        command()
    assert state(rt) == before, "a refused command wrote or changed something"


def commands(tenant: str, cid: str) -> dict[str, Callable[[EmbeddedRuntime], Any]]:
    return {
        "add_members": lambda rt: rt.app.add_members(tenant, cid, ["eve"]),
        "remove_member": lambda rt: rt.app.remove_member(tenant, cid, "bob"),
        "send_message": lambda rt: rt.app.send_message(tenant, cid, sender="ann", text="injected"),
        "send_message_retry": lambda rt: rt.app.send_message(tenant, cid, sender="ann", text="x", client_msg_id="k"),
        "mark_read": lambda rt: rt.app.mark_read(tenant, cid, "bob", 1),
        "request_rebuild": lambda rt: rt.app.request_rebuild(tenant, cid, "bob"),
        "evaluate_conversation": lambda rt: rt.app.evaluate_conversation(tenant, cid),
        "conversation": lambda rt: rt.app.conversation(tenant, cid),
    }


PREFIX_COMMANDS = commands("acme/x", "secret")


@pytest.mark.parametrize("name", list(PREFIX_COMMANDS))
def test_a_tenant_named_like_a_prefix_cannot_reach_another_tenants_conversation(
    rt: EmbeddedRuntime, name: str
) -> None:
    """A cross-tenant write: `acme/x` + `secret` used to load `acme`'s `x/secret`."""
    refused(rt, InvalidArgument, lambda: PREFIX_COMMANDS[name](rt))


@pytest.mark.parametrize(
    "command",
    [
        lambda rt: rt.app.create_conversation("acme/x", "secret", "", ["eve"]),
        lambda rt: rt.app.create_conversation("acme/x", None, "", []),
        lambda rt: rt.app.open_review("acme/x", "small", "T1", {}, "x"),
        lambda rt: rt.app.open_review("acme/x", "small", "T1", {}, "x", review_key="T1/acme/x/small/1"),
        lambda rt: rt.app.tiers("acme/x"),
        lambda rt: rt.app.tier_terms("acme/x", "small"),
        lambda rt: rt.app.roll_back_tier("acme/x", "small", "x", "why"),
        lambda rt: rt.app.create_conversation("", "c", "", []),
        lambda rt: rt.app.add_members("\ud800", "c", ["eve"]),
    ],
    ids=["create", "create-generated-id", "open-review", "open-review-by-key", "tiers", "tier-terms", "rollback",
         "empty-tenant", "surrogate-tenant"],
)  # fmt: skip
def test_every_other_command_refuses_a_tenant_outside_the_alphabet(
    rt: EmbeddedRuntime, command: Callable[[EmbeddedRuntime], Any]
) -> None:
    refused(rt, InvalidArgument, lambda: command(rt))


def test_ids_that_cannot_be_stored_are_refused_before_anything_is_written(rt: EmbeddedRuntime) -> None:
    refused(rt, InvalidArgument, lambda: rt.app.add_members("acme", "x/secret", ["eve\ud800"]))
    refused(rt, InvalidArgument, lambda: rt.app.create_conversation("acme", "c\udfff", "", []))
    refused(rt, InvalidArgument, lambda: rt.app.send_message("acme", "x/secret\ud800", sender="ann", text="x"))


# -- a loaded aggregate of another tenant is never acted on ----------------------------


def collide(monkeypatch: pytest.MonkeyPatch, cls: type[Any], victim: UUID) -> None:
    """Make `cls.create_id` derive the victim's id for every other name: what a
    derivation collision (the cross-tenant write ADR-0008 fixed) would do."""
    original = cls.create_id

    def create_id(*args: Any, **kwargs: Any) -> UUID:
        derived: UUID = original(*args, **kwargs)
        return derived if derived == victim else victim

    monkeypatch.setattr(cls, "create_id", staticmethod(create_id))


GLOBEX_COMMANDS = commands("globex", "secret")


@pytest.mark.parametrize("name", list(GLOBEX_COMMANDS))
def test_a_conversation_of_another_tenant_under_a_derived_id_is_not_found(
    rt: EmbeddedRuntime, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    collide(monkeypatch, Conversation, Conversation.create_id("acme", "x/secret"))
    refused(rt, NotFound, lambda: GLOBEX_COMMANDS[name](rt))


def test_creating_over_a_conversation_of_another_tenant_writes_nothing(
    rt: EmbeddedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    collide(monkeypatch, Conversation, Conversation.create_id("acme", "x/secret"))
    refused(rt, NotFound, lambda: rt.app.create_conversation("globex", "secret", "", ["eve"]))


def test_a_conversation_of_the_same_tenant_but_another_id_is_not_found(
    rt: EmbeddedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    collide(monkeypatch, Conversation, Conversation.create_id("acme", "x/secret"))
    refused(rt, NotFound, lambda: rt.app.add_members("acme", "other", ["eve"]))


def enable_small_tier(rt: EmbeddedRuntime, tenant: str) -> str:
    rid = rt.app.open_review(tenant, "small", "T1", {}, "ops")["review_id"]
    rt.app.decide_review(tenant, rid, "enable_mention_only", "ops", 1.0, 0.9)
    return str(rid)


def test_a_tier_of_another_tenant_under_a_derived_id_is_not_found(
    rt: EmbeddedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    enable_small_tier(rt, "acme")
    rt.app.create_conversation("globex", "g", "", ["zed"])
    collide(monkeypatch, Tier, Tier.create_id("acme", "small"))
    rt.app._no_tier.clear()
    for command in (
        lambda: rt.app.tier_terms("globex", "small"),
        lambda: rt.app.tiers("globex"),
        lambda: rt.app.roll_back_tier("globex", "small", "x", "why"),
        lambda: rt.app.send_message("globex", "g", sender="zed", text="evaluates the tier"),
    ):
        refused(rt, NotFound, command)
    assert rt.app.tier_terms("acme", "small").enabled


def test_a_quota_of_another_tenant_under_a_derived_id_is_not_charged(
    rt: EmbeddedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt.app.create_conversation("globex", "g", "", ["zed"])
    collide(monkeypatch, TenantQuota, TenantQuota.create_id("acme"))
    refused(rt, NotFound, lambda: rt.app.send_message("globex", "g", sender="zed", text="charged to acme?"))


def test_a_review_id_that_names_another_kind_of_aggregate_is_not_found(rt: EmbeddedRuntime) -> None:
    """A conversation's aggregate id passed as a review id is no review."""
    conv_id = str(Conversation.create_id("acme", "x/secret"))
    refused(rt, NotFound, lambda: rt.app.review("acme", conv_id))
    refused(rt, NotFound, lambda: rt.app.decide_review("acme", conv_id, "no_action", "ops"))


def test_a_review_of_another_tenant_found_by_its_key_is_not_found(rt: EmbeddedRuntime) -> None:
    key = "T1/acme/small/7"
    rid = rt.app.open_review("acme", "small", "T1", {}, "monitor", review_key=key)["review_id"]
    refused(rt, NotFound, lambda: rt.app.open_review("globex", "small", "T1", {}, "monitor", review_key=key))
    refused(rt, NotFound, lambda: rt.app.review("globex", rid))
    refused(rt, NotFound, lambda: rt.app.decide_review("globex", rid, "enable_mention_only", "ops", 1.0, 0.9))
    assert rt.app.review("acme", rid).status == "open"
