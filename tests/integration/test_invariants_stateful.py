"""Invariants D, G, U, M, H and A (SPEC section 5) on the REAL embedded runtime
(SQLite event store, SQLite views, the projection runner run synchronously),
driven by a hypothesis state machine against a small reference model written here.

Parameters are shrunk so every path is reachable in a few steps: groups of at most
12 (small <= 4 < medium <= 8 < large), a 10 s activity window, a 5 s minimum switch
interval, tight admission limits and a small tenant fan-out quota."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from domain.conversation import READ_ACTIVITY_REFRESH, Conversation
from domain.delivery import ANNOUNCEMENT, MENTION, MENTION_ALL, OWN, REPLY
from domain.errors import (
    AlreadyExists,
    Conflict,
    FanoutQuotaExceeded,
    GroupFull,
    NotAMember,
    NotFound,
    RateLimited,
)
from domain.params import Parameters, Rate
from domain.review import Review
from domain.tier import Tier
from tests.integration.conftest import FakeClock, Harness

pytestmark = pytest.mark.slow  # the machines run for a minute or two

T = "t"
USERS = tuple(f"u{i}" for i in range(14))
CIDS = ("c0", "c1")
BUCKETS = ("small", "medium", "large")
WINDOW = 10.0
MIN_INTERVAL = 5.0
CONV_RATE = {"small": 3.0, "medium": 2.0, "large": 1.0}
SENDER_RATE = Rate(1, 3.0)
QUOTA_CAPACITY = 40.0
QUOTA_REFILL = 4.0
EPS = 1e-6

PARAMS = Parameters(
    max_group_members=12,
    small_max_members=4,
    medium_max_members=8,
    rate_small=CONV_RATE["small"],
    rate_medium=CONV_RATE["medium"],
    rate_large=CONV_RATE["large"],
    per_sender_in_conversation_rate=SENDER_RATE,
    tenant_fanout_quota_capacity=QUOTA_CAPACITY,
    tenant_fanout_quota_refill_per_sec=QUOTA_REFILL,
    activity_window=WINDOW,
    policy_switch_min_interval=MIN_INTERVAL,
    mailbox_shards=4,
    # The per-user command gate has its own tests; here it must not refuse a MARK_READ.
    per_user_command_rate=Rate(1000, 1.0),
    per_user_command_burst=1000.0,
)


# -- the reference model ------------------------------------------------------------


def is_active(last: float, now: float) -> bool:
    return last > 0.0 and last >= now - WINDOW


def bucket_of(n: int) -> str:
    return "small" if n <= 4 else "medium" if n <= 8 else "large"


@dataclass(frozen=True)
class Msg:
    seq: int
    sender: str
    at: float
    mentions: frozenset[str]  # members mentioned, sender excluded
    reply_user: str | None  # sender of the replied-to message, if a member
    mention_all: bool
    announcement: bool
    policy: str
    members: frozenset[str]  # members when it was sent
    recipients: frozenset[str]  # who must hold a mailbox entry

    def mentions_user(self, u: str) -> bool:
        if u == self.sender:
            return False
        return self.mention_all or self.announcement or u in self.mentions or u == self.reply_user

    def flags_for(self, u: str) -> int:
        flags = 0
        if u in self.mentions:
            flags |= MENTION
        if u == self.reply_user and u != self.sender:
            flags |= REPLY
        if self.announcement:
            flags |= ANNOUNCEMENT
        if self.mention_all:
            flags |= MENTION_ALL
        if u == self.sender:
            flags |= OWN
        return flags


@dataclass
class ConvModel:
    cid: str
    members: dict[str, float] = field(default_factory=dict)  # user -> last_active (0.0 never)
    read: dict[str, int] = field(default_factory=dict)
    start: dict[str, int] = field(default_factory=dict)  # seq at the start of the current membership
    period: Counter[str] = field(default_factory=Counter)  # how many times each user joined
    msgs: list[Msg] = field(default_factory=list)
    policy: str = "always"
    scope: str | None = None
    last_switch: float | None = None
    client_ids: dict[str, int] = field(default_factory=dict)
    accepted: list[tuple[float, float]] = field(default_factory=list)  # (at, conversation rate)
    sender_times: dict[tuple[str, int], list[float]] = field(default_factory=dict)

    @property
    def latest(self) -> int:
        return len(self.msgs)

    @property
    def bucket(self) -> str:
        return bucket_of(len(self.members))

    def join(self, users: list[str]) -> None:
        for u in users:
            self.members[u] = 0.0
            self.read[u] = self.latest
            self.start[u] = self.latest
            self.period[u] += 1

    def leave(self, u: str) -> None:
        del self.members[u]
        del self.read[u]
        del self.start[u]

    def unread(self, u: str) -> int:
        return sum(1 for m in self.msgs[self.read[u] :] if m.sender != u)

    def mention_count(self, u: str) -> int:
        return sum(1 for m in self.msgs[self.read[u] :] if m.mentions_user(u))

    def sent_while_member(self, u: str) -> set[int]:
        return {m.seq for m in self.msgs if u in m.members}


@dataclass
class Switch:
    cid: str
    to: str
    rollback: bool
    at: float


@dataclass
class Client:
    """A client device following the sync protocol; its store survives server restarts."""

    cursor: int = 0
    held: dict[str, set[int]] = field(default_factory=dict)
    seen: int = 0  # mailbox entries read so far


class Model:
    def __init__(self) -> None:
        self.convs: dict[str, ConvModel] = {}
        self.tiers: dict[str, tuple[float, float] | None] = {}  # absent: never created; None: disabled
        self.switches: list[Switch] = []
        self.quota: list[tuple[float, int]] = []

    def decide(self, c: ConvModel, now: float) -> tuple[str, bool] | None:
        """The switch the spec requires at an evaluation point: (to, is_rollback) or None."""
        scope = c.scope or c.bucket
        terms = self.tiers.get(scope)
        if c.policy == "mention_only" and terms is None:
            return "always", True
        if terms is None:
            return None
        if c.last_switch is not None and now - c.last_switch < MIN_INTERVAL:
            return None
        n = len(c.members)
        alpha = sum(1 for t in c.members.values() if is_active(t, now)) / n if n else 0.0
        min_saving, ratio = terms
        if c.policy == "always":
            if n * (1.0 - alpha) > min_saving and alpha < ratio:
                return "mention_only", False
            return None
        n_eq = min_saving / (1.0 - alpha) if alpha < 1.0 else math.inf
        if alpha >= ratio or n < PARAMS.policy_switch_exit_ratio * n_eq:
            return "always", False
        return None

    def apply(self, c: ConvModel, switch: tuple[str, bool] | None, now: float) -> None:
        if switch is None:
            return
        to, rollback = switch
        scope = c.scope or c.bucket
        c.policy = to
        c.last_switch = now
        c.scope = scope if to == "mention_only" else None
        self.switches.append(Switch(c.cid, to, rollback, now))

    def evaluate(self, c: ConvModel, now: float) -> None:
        self.apply(c, self.decide(c, now), now)


# -- the machine ----------------------------------------------------------------------


def check_window(times: list[tuple[float, float]], bound: Any, what: str) -> None:
    """The newest accepted item against every window that ends at it."""
    t_end = times[-1][0]
    total = 0.0
    for t, weight in reversed(times):
        total += weight
        limit = bound(t_end - t, t)
        assert total <= limit + EPS, f"{what}: {total} accepted in {t_end - t:.3f}s, limit {limit}"


class FanoutMachine(RuleBasedStateMachine):
    DEVICES = 1  # client devices per user

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="fanout-inv-"))
        self.clock = FakeClock()
        self.t = self.tenant()
        self.h = self.open_harness()
        self.model = Model()
        self.clients: dict[tuple[str, int], Client] = {}  # (user, device)
        self.h_tiers: dict[Any, bool] = {}
        self.h_reviews: dict[str, tuple[str, str]] = {}
        self.h_last: dict[Any, float] = {}
        self.h_seen: list[Switch] = []
        self.names: dict[Any, str] = {Conversation.create_id(self.t, c): c for c in CIDS}
        self.msg_counter = 0
        self.pulls = 0
        # Lag: while > 0, commands are not projected; the backlog is then applied in ONE
        # unit of work (sends, joins and leaves of several steps in one batch).
        self.lag = 0
        self.lagged_batches = 0
        self.unchecked: list[tuple[str, int, int, str]] = []  # (cid, seq, recipients, policy)
        self.h_pos = self.h.log_top()  # H reads this example's events (a shared store holds earlier ones)

    # -- what a runtime variant of the machine changes (tests/distributed/test_invariants.py) --

    def tenant(self) -> str:
        return T

    def open_harness(self) -> Any:
        """The runtime under test: the embedded one over a data dir of its own."""
        return Harness(self.dir, PARAMS, self.clock)

    def teardown(self) -> None:
        msgs = [m for c in self.model.convs.values() for m in c.msgs]
        event(f"switches: {min(len(self.model.switches), 3)}")
        event(f"messages in mention_only: {min(sum(m.policy == 'mention_only' for m in msgs), 3)}")
        event(f"members skipped: {min(sum(len(m.members - m.recipients) for m in msgs), 3)}")
        event(f"history pulls: {min(self.pulls, 3)}")
        event(f"batches applied with lag: {min(self.lagged_batches, 3)}")
        self.h.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def now(self) -> float:
        return self.clock.now

    # -- the projector: in step, or behind the log -------------------------------------

    def settle(self) -> None:
        """After a command: project it now, or leave it in the backlog while lagging."""
        if self.lag > 0:
            self.lag -= 1
            if self.lag > 0:
                return
            self.lagged_batches += 1
        self.fresh()

    def fresh(self) -> None:
        """Catch the views up with the log (in one batch), then check what waited for it.
        Called before reads, and before commands that read the views (the serving runtime
        waits for its projector there)."""
        self.lag = 0
        self.h.settle()
        for cid, seq, recipients, policy in self.unchecked:
            # A: every accepted message is fully materialized.
            rec = self.h.queries.delivery(self.t, cid, seq)
            assert rec["mailbox_entries"] == recipients, (rec, recipients)
            assert rec["materialized_at"] is not None
            assert rec["write_policy"] == policy
        self.unchecked.clear()

    @rule(steps=st.integers(2, 8))
    def fall_behind(self, steps: int) -> None:
        """The projector stops following for the next few commands."""
        self.lag = steps

    def conv_of(self, data: st.DataObject) -> ConvModel:
        return self.model.convs[data.draw(st.sampled_from(sorted(self.model.convs)), label="cid")]

    def has_convs(self) -> bool:
        return bool(self.model.convs)

    # -- membership ---------------------------------------------------------------

    @initialize(
        members=st.lists(st.sampled_from(USERS), min_size=1, max_size=7, unique=True),
        tiers=st.sampled_from(["none", "small", "all"]),
    )
    def create_first(self, members: list[str], tiers: str) -> None:
        """Start with one conversation, and often with mention_only tiers already enabled."""
        self.create("c0", members)
        for bucket in {"none": (), "small": ("small",), "all": BUCKETS}[tiers]:
            self.enable_tier(bucket, "enable_mention_only", 1.5, 0.5)

    @rule(cid=st.sampled_from(CIDS), members=st.lists(st.sampled_from(USERS), max_size=6, unique=True))
    def create_conversation(self, cid: str, members: list[str]) -> None:
        self.create(cid, members)

    def create(self, cid: str, members: list[str]) -> None:
        if cid in self.model.convs:
            with pytest.raises(AlreadyExists):
                self.h.app.create_conversation(self.t, cid, "", members)
            return
        self.h.app.create_conversation(self.t, cid, f"title {cid}", members)
        c = self.model.convs[cid] = ConvModel(cid)
        c.join(members)  # creation is not an evaluation point
        self.settle()

    @precondition(has_convs)
    @rule(data=st.data(), users=st.lists(st.sampled_from(USERS), min_size=1, max_size=5))
    def join(self, data: st.DataObject, users: list[str]) -> None:
        c = self.conv_of(data)
        new = [u for u in dict.fromkeys(users) if u not in c.members]
        if len(c.members) + len(new) > PARAMS.max_group_members:
            before = self.h.log_top()
            with pytest.raises(GroupFull):
                self.h.app.add_members(self.t, c.cid, users)
            assert self.h.log_top() == before
            return
        out = self.h.app.add_members(self.t, c.cid, users)
        assert out["added"] == len(new)
        if new:
            c.join(new)
            self.model.evaluate(c, self.now)
        self.settle()

    @precondition(has_convs)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        c = self.conv_of(data)
        u = data.draw(st.sampled_from(USERS), label="user")
        if u not in c.members:
            with pytest.raises(NotAMember):
                self.h.app.remove_member(self.t, c.cid, u)
            return
        self.h.app.remove_member(self.t, c.cid, u)
        c.leave(u)
        self.model.evaluate(c, self.now)
        self.settle()

    # -- sending ----------------------------------------------------------------------

    @precondition(has_convs)
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        self.send_one(data)

    @precondition(has_convs)
    @rule(data=st.data())
    def send_another(self, data: st.DataObject) -> None:
        self.send_one(data)

    @precondition(has_convs)
    @rule(data=st.data())
    def send_later(self, data: st.DataObject) -> None:
        self.clock.advance(data.draw(st.sampled_from([0.5, 3.0, 12.0]), label="wait"))
        self.send_one(data)

    def send_one(self, data: st.DataObject) -> None:
        c = self.conv_of(data)
        if c.members and data.draw(st.integers(0, 9), label="stranger?") > 0:
            sender = data.draw(st.sampled_from(sorted(c.members)), label="sender")
        else:
            sender = data.draw(st.sampled_from(USERS), label="sender")
        mentions = data.draw(st.lists(st.sampled_from(USERS), max_size=3, unique=True), label="mentions")
        reply = data.draw(st.one_of(st.none(), st.integers(1, c.latest)), label="reply") if c.latest else None
        mention_all = data.draw(st.integers(0, 6), label="@all?") == 0
        announcement = data.draw(st.integers(0, 6), label="announcement?") == 0
        kind = data.draw(st.sampled_from(["none", "new", "retry"]), label="client_msg_id")
        if kind == "retry" and c.client_ids:
            cmid: str | None = data.draw(st.sampled_from(sorted(c.client_ids)), label="retry id")
        elif kind == "none":
            cmid = None
        else:
            self.msg_counter += 1
            cmid = f"cm{self.msg_counter}"
        self.do_send(c, sender, mentions, reply, mention_all, announcement, cmid)

    def do_send(
        self,
        c: ConvModel,
        sender: str,
        mentions: list[str],
        reply: int | None,
        mention_all: bool,
        announcement: bool,
        cmid: str | None,
    ) -> dict[str, Any] | Exception:
        now = self.now
        before = self.h.log_top()
        kwargs = dict(
            sender=sender,
            text=f"m{len(c.msgs) + 1} by {sender}",
            mentions=mentions,
            mention_all=mention_all,
            reply_to_seq=reply,
            announcement=announcement,
            client_msg_id=cmid,
        )
        if cmid is not None and cmid in c.client_ids:
            out = self.h.app.send_message(self.t, c.cid, **kwargs)
            assert out["conversation_seq"] == c.client_ids[cmid], "a retry must return the original seq"
            assert out.get("duplicate") is True
            assert self.h.log_top() == before, "a retried send appended events"
            return out
        if sender not in c.members:
            with pytest.raises(NotAMember):
                self.h.app.send_message(self.t, c.cid, **kwargs)
            assert self.h.log_top() == before
            return NotAMember("")
        switch = self.model.decide(c, now)
        try:
            out = self.h.app.send_message(self.t, c.cid, **kwargs)
        except (RateLimited, FanoutQuotaExceeded) as exc:
            # A: every rejection is explicit, with a retry hint, and writes nothing.
            assert isinstance(exc.details.get("retry_after_ms"), int) and exc.details["retry_after_ms"] >= 1, exc.details
            assert exc.details.get("gate") in (
                "per_conversation_msg_rate",
                "per_sender_in_conversation_rate",
                "tenant_fanout_quota",
            )
            assert self.h.log_top() == before
            return exc
        # accepted: the model takes the evaluation, then the message
        self.model.apply(c, switch, now)
        seq = c.latest + 1
        assert out["conversation_seq"] == seq
        assert out["write_policy"] == c.policy, f"policy after evaluation: system {out['write_policy']}, model {c.policy}"
        members = dict(c.members)
        members[sender] = now  # sending is activity
        mset = frozenset(m for m in mentions if m in c.members and m != sender)
        reply_user = c.msgs[reply - 1].sender if reply is not None else None
        if reply_user not in c.members:
            reply_user = None
        if c.policy == "always" or mention_all or announcement:
            recipients = frozenset(members)
        else:
            personal = set(mset) | {sender} | ({reply_user} if reply_user else set())
            recipients = frozenset(u for u, t in members.items() if u in personal or is_active(t, now))
        rate = CONV_RATE[c.bucket]
        msg = Msg(seq, sender, now, mset, reply_user, mention_all, announcement, c.policy, frozenset(c.members), recipients)
        c.msgs.append(msg)
        c.members[sender] = now
        c.read[sender] = max(c.read[sender], seq)  # sending marks the conversation read
        if cmid is not None:
            c.client_ids[cmid] = seq
        # A: accepted rates never exceed the limits, over every window ending now.
        c.accepted.append((now, rate))
        check_window(
            [(t, 1.0) for t, _ in c.accepted],
            # capacity is the rate, at least one message; refill is the rate
            lambda span, t: max(max(r for at, r in c.accepted if at >= t), 1.0) + max(r for at, r in c.accepted if at >= t) * span,
            f"per_conversation_msg_rate of {c.cid}",
        )
        key = (sender, c.period[sender])  # a leave drops the sender's bucket: count per membership
        times = c.sender_times.setdefault(key, [])
        times.append(now)
        check_window(
            [(t, 1.0) for t in times],
            lambda span, t: SENDER_RATE.count + span * SENDER_RATE.per_second,
            f"per_sender_in_conversation_rate of {sender} in {c.cid}",
        )
        self.model.quota.append((now, len(recipients)))
        check_window(self.model.quota, lambda span, t: QUOTA_CAPACITY + QUOTA_REFILL * span, "tenant_fanout_quota")
        self.unchecked.append((c.cid, seq, len(recipients), c.policy))
        self.settle()
        return out

    @precondition(has_convs)
    @rule(data=st.data())
    def send_rejected_then_retry_at_the_hint(self, data: st.DataObject) -> None:
        """A burst until a gate refuses, then a retry exactly at the hinted time passes that gate."""
        c = self.conv_of(data)
        if not c.members:
            return
        sender = data.draw(st.sampled_from(sorted(c.members)), label="sender")
        for _ in range(4):
            out = self.do_send(c, sender, [], None, False, False, None)
            if isinstance(out, RateLimited | FanoutQuotaExceeded):
                break
        else:
            return
        gate, hint = out.details["gate"], out.details["retry_after_ms"]
        entries = out.details.get("entries")
        self.clock.advance(hint / 1000)
        again = self.do_send(c, sender, [], None, False, False, None)
        if isinstance(again, RateLimited | FanoutQuotaExceeded):
            # the same gate may refuse again only if the retry costs more (the policy changed)
            assert again.details["gate"] != gate or (
                gate == "tenant_fanout_quota" and again.details.get("entries", 0) > (entries or 0)
            ), f"retry at the hinted time refused again by {gate}: {out.details} then {again.details}"

    @rule(dt=st.sampled_from([0.1, 0.4, 1.0, 2.0, 3.0, 5.0, 11.0, 86_400.0]))
    def advance_time(self, dt: float) -> None:
        self.clock.advance(dt)

    @precondition(has_convs)
    @rule(data=st.data())
    def alpha_update(self, data: st.DataObject) -> None:
        c = self.conv_of(data)
        policy = self.h.app.evaluate_conversation(self.t, c.cid)
        self.model.evaluate(c, self.now)
        assert policy == c.policy
        self.settle()

    # -- reviews and tiers --------------------------------------------------------------

    @rule(
        bucket=st.sampled_from(BUCKETS),
        decision=st.sampled_from(["enable_mention_only", "enable_mention_only", "no_action", "scale_out"]),
        min_saving=st.sampled_from([1.5, 2.5]),
        ratio=st.sampled_from([0.5, 0.75]),
    )
    def enable_tier(self, bucket: str, decision: str, min_saving: float, ratio: float) -> None:
        """A review decided; only enable_mention_only enables the tier (and evaluates its scope)."""
        trigger = "manual" if decision == "enable_mention_only" else "T1"
        rid = self.h.app.open_review(self.t, bucket, trigger, {}, "admin")["review_id"]
        if decision != "enable_mention_only":
            self.h.app.decide_review(self.t, rid, decision, "admin")
            self.settle()
            return
        self.fresh()  # the tier change evaluates its scope's conversations, read from the views
        self.h.app.decide_review(self.t, rid, decision, "admin", min_saving, ratio)
        self.model.tiers[bucket] = (min_saving, ratio)
        # a tier change is an evaluation point for the conversations of its scope
        for c in self.model.convs.values():
            if c.bucket == bucket:
                self.model.evaluate(c, self.now)
        self.settle()

    @rule(bucket=st.sampled_from(BUCKETS))
    def roll_back_tier(self, bucket: str) -> None:
        state = self.model.tiers.get(bucket, "never")
        if state == "never":
            with pytest.raises(NotFound):
                self.h.app.roll_back_tier(self.t, bucket, "admin", "test")
            return
        if state is None:
            with pytest.raises(Conflict):
                self.h.app.roll_back_tier(self.t, bucket, "admin", "test")
            return
        out = self.h.app.roll_back_tier(self.t, bucket, "admin", "test")
        self.model.tiers[bucket] = None
        expected = sorted(c.cid for c in self.model.convs.values() if c.policy == "mention_only" and c.scope == bucket)
        assert sorted(out["returned_to_always"]) == expected
        for cid in expected:
            self.model.apply(self.model.convs[cid], ("always", True), self.now)
        self.settle()

    # -- clients ----------------------------------------------------------------------

    @rule(user=st.sampled_from(USERS), device=st.integers(0, 1), new_device=st.integers(0, 5))
    def client_sync(self, user: str, device: int, new_device: int) -> None:
        self.sync(user, device % self.DEVICES, new_device == 0)

    @precondition(has_convs)
    @rule(data=st.data(), device=st.integers(0, 1))
    def member_client_sync(self, data: st.DataObject, device: int) -> None:
        c = self.conv_of(data)
        if c.members:
            self.sync(data.draw(st.sampled_from(sorted(c.members)), label="user"), device % self.DEVICES, False)

    def sync(self, user: str, device: int, new_device: bool) -> None:
        """G: session list, mailbox from the cursor, PULL_HISTORY for every flagged range."""
        self.fresh()
        if new_device:
            self.clients[(user, device)] = Client()
        client = self.clients.setdefault((user, device), Client())
        q = self.h.queries
        sessions, _ = q.session_list(self.t, user)
        while True:
            page = q.mailbox(self.t, user, client.cursor, 5)
            for e in page["entries"]:
                assert e["cursor"] > client.cursor
                client.held.setdefault(e["conversation_id"], set()).add(e["conversation_seq"])
                client.cursor = e["cursor"]
                client.seen += 1
            client.cursor = page["next_after"]
            if not page["more"]:
                break
        for s in sessions:
            delivered = s.get("delivered_conversation_seq")
            if delivered is None or delivered >= s["latest_conversation_seq"]:
                continue
            after = delivered
            self.pulls += 1
            while True:
                page = q.history(self.t, s["conversation_id"], user, after, 4)
                for m in page["messages"]:
                    client.held.setdefault(s["conversation_id"], set()).add(m["conversation_seq"])
                    after = m["conversation_seq"]
                if not page["more"]:
                    break
        for cid, c in self.model.convs.items():
            held = client.held.get(cid, set())
            assert held <= c.sent_while_member(user), f"G: {user} holds messages of {cid} it was never sent"
            if user in c.members:
                missing = set(range(c.start[user] + 1, c.latest + 1)) - held
                assert not missing, f"G: {user} synced but misses {sorted(missing)} of {cid} (undetectable gap)"
        # the mailbox cursor never skipped an entry
        assert client.seen == sum(
            1 for c in self.model.convs.values() for m in c.msgs if user in m.recipients
        ), "the mailbox cursor skipped or repeated entries"

    @rule(data=st.data())
    def client_mark_read(self, data: st.DataObject) -> None:
        """MARK_READ only a seq the client holds (the protocol); to latest, unread becomes exact."""
        if not self.clients:
            return
        user, device = data.draw(st.sampled_from(sorted(self.clients)), label="device")
        client = self.clients[(user, device)]
        choices = sorted(
            (cid, s) for cid, seqs in client.held.items() if user in self.model.convs[cid].members for s in seqs
        )
        if not choices:
            return
        cid, seq = data.draw(st.sampled_from(choices), label="read")
        if data.draw(st.booleans(), label="latest held?"):
            seq = max(client.held[cid])
        c = self.model.convs[cid]
        self.fresh()  # coalescing compares with the read seq the views show
        out = self.h.app.mark_read(self.t, cid, user, seq)
        # A MARK_READ that changes nothing (not ahead, activity recent) is coalesced (ADR-0009).
        last = c.members[user]
        coalesced = seq <= c.read[user] and last > 0.0 and self.now - last < WINDOW * READ_ACTIVITY_REFRESH
        assert out["coalesced"] is coalesced, (out, c.read[user], last, self.now)
        c.read[user] = max(c.read[user], seq)
        if not coalesced and not (last > 0.0 and self.now - last < WINDOW * READ_ACTIVITY_REFRESH):
            # MARK_READ is activity, recorded on the conversation only when the recorded one
            # is stale (ADR-0018), group-committed before this process's next write to the
            # conversation (a send decides with it) or by the flush thread.
            c.members[user] = self.now
        self.settle()
        if seq == c.latest and not self.lag:
            item = self.session(user, cid)
            assert item["unread_exact"] is True, f"U: MARK_READ to latest left unread inexact: {item}"

    @precondition(has_convs)
    @rule(data=st.data())
    def rebuild(self, data: st.DataObject) -> None:
        c = self.conv_of(data)
        if not c.members:
            return
        user = data.draw(st.sampled_from(sorted(c.members)), label="user")
        self.h.app.request_rebuild(self.t, c.cid, user)
        self.settle()
        if self.lag:
            return
        item = self.session(user, c.cid)
        assert item["unread_exact"] is True, f"U: REBUILD left unread inexact: {item}"

    @rule()
    def restart(self) -> None:
        """Restart; the new runner applies any backlog in one batch."""
        self.h.restart()
        self.fresh()

    def session(self, user: str, cid: str) -> dict[str, Any]:
        sessions, _ = self.h.queries.session_list(self.t, user)
        found = [s for s in sessions if s["conversation_id"] == cid]
        assert len(found) == 1, sessions
        return found[0]

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def heads_match_the_model(self) -> None:
        if self.lag:
            return  # checked once the backlog is applied
        for cid, c in self.model.convs.items():
            head = self.h.queries.head(self.t, cid)
            assert head["latest_conversation_seq"] == c.latest
            assert head["member_count"] == len(c.members)
            assert head["size_bucket"] == c.bucket
            assert head["write_policy"] == c.policy, f"{cid}: head {head['write_policy']}, model {c.policy}"

    @invariant()
    def sessions_unread_and_mentions_are_exact(self) -> None:
        """U and M for every user, plus the session list's shape."""
        if self.lag:
            return  # checked once the backlog is applied
        for user in USERS:
            sessions, big = self.h.queries.session_list(self.t, user)
            mine = {cid for cid, c in self.model.convs.items() if user in c.members}
            assert {s["conversation_id"] for s in sessions} == mine
            assert len(sessions) == len(mine)
            assert {b["conversation_id"] for b in big} == {
                cid for cid in mine if self.model.convs[cid].policy == "mention_only"
            }
            for s in sessions:
                c = self.model.convs[s["conversation_id"]]
                where = f"{user} in {c.cid}: {s}"
                assert s["latest_conversation_seq"] == c.latest, where
                assert s["read_conversation_seq"] == c.read[user], where
                assert s["write_policy"] == c.policy, where
                if s["unread_exact"]:
                    assert s["unread_count"] == c.unread(user), f"U: {where}, expected {c.unread(user)}"
                assert s["mention_count"] == c.mention_count(user), f"M: {where}, expected {c.mention_count(user)}"
                if s["write_policy"] == "mention_only" or not s["unread_exact"]:
                    assert "delivered_conversation_seq" in s, where

    @invariant()
    def mailboxes_hold_exactly_the_materialized_entries(self) -> None:
        """D (and beyond: in mention_only, exactly the recipients), each entry once, right flags."""
        if self.lag:
            return  # checked once the backlog is applied
        for user in USERS:
            got: list[tuple[str, int, int]] = []
            after = 0
            while True:
                page = self.h.queries.mailbox(self.t, user, after, 50)
                got.extend((e["conversation_id"], e["conversation_seq"], e["flags"]) for e in page["entries"])
                after = page["next_after"]
                if not page["more"]:
                    break
            expected = [
                (c.cid, m.seq, m.flags_for(user))
                for c in self.model.convs.values()
                for m in c.msgs
                if user in m.recipients
            ]
            dupes = [k for k, n in Counter((cid, seq) for cid, seq, _ in got).items() if n > 1]
            assert not dupes, f"D: {user} holds duplicate entries {dupes}"
            assert sorted(got) == sorted(expected), f"D: mailbox of {user}"
            always = {(c.cid, m.seq) for c in self.model.convs.values() for m in c.msgs if m.policy == "always" and user in m.members}
            assert always <= {(cid, seq) for cid, seq, _ in got}, "D: a member misses an entry sent in always"

    @invariant()
    def policy_switches_are_legal_and_as_specified(self) -> None:
        """H, read from the event store itself."""
        recorder = self.h.app.recorder
        while True:
            notes = recorder.select_notifications(start=self.h_pos, limit=500, inclusive_of_start=False)
            if not notes:
                break
            for note in notes:
                self.h_pos = note.id
                e = self.h.app.mapper.to_domain_event(note)
                if isinstance(e, Review.Decided):
                    self.h_reviews[str(e.originator_id)] = (e.decision, str(e.originator_id))
                elif isinstance(e, Tier.Enabled):
                    decision = self.h_reviews.get(e.review_id, (None,))[0]
                    assert decision == "enable_mention_only", f"H: tier enabled by review {e.review_id} ({decision})"
                    self.h_tiers[e.originator_id] = True
                elif isinstance(e, Tier.RolledBack):
                    self.h_tiers[e.originator_id] = False
                elif isinstance(e, Conversation.WritePolicyChanged):
                    cid = self.names[e.originator_id]
                    if e.to_policy == "mention_only":
                        assert self.h_tiers.get(Tier.create_id(self.t, e.size_bucket)), f"H: {cid} entered without a tier"
                    prev = self.h_last.get(e.originator_id)
                    if prev is not None and e.at - prev < MIN_INTERVAL:
                        assert e.to_policy == "always" and e.reason == "tier_rollback", (
                            f"H: {cid} switched {e.at - prev:.3f}s after its last switch ({e.reason})"
                        )
                    self.h_last[e.originator_id] = e.at
                    self.h_seen.append(Switch(cid, e.to_policy, e.reason == "tier_rollback", e.at))
        # Switches at the same instant (a tier rollback returns its whole roster) have no
        # specified order; each conversation's own switches keep theirs (a stable sort).
        def canonical(switches: list[Switch]) -> list[Switch]:
            return sorted(switches, key=lambda sw: (sw.at, sw.cid))

        assert canonical(self.h_seen) == canonical(self.model.switches), (
            "H: the switches differ from the spec's state machine"
        )


class MultiDeviceMachine(FanoutMachine):
    """The same, with two devices per user: a MARK_READ on one device must not hide a gap
    from the other (G holds per device, each following the protocol on its own cursor)."""

    DEVICES = 2


SETTINGS = settings(
    max_examples=int(os.environ.get("FANOUT_INVARIANT_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    phases=[p for p in Phase if p is not Phase.shrink] if os.environ.get("FANOUT_INVARIANT_NO_SHRINK") else list(Phase),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FanoutMachine.TestCase.settings = SETTINGS
MultiDeviceMachine.TestCase.settings = SETTINGS
TestInvariants = FanoutMachine.TestCase
TestInvariantsWithTwoDevicesPerUser = MultiDeviceMachine.TestCase
