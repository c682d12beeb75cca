"""Property tests of who gets a UserMailboxEntry (ADR decision 4, minimal change set d/e)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from domain.delivery import (
    ANNOUNCEMENT,
    MENTION,
    MENTION_ALL,
    MENTION_FLAGS,
    OWN,
    REPLY,
    Targets,
    materialized_members,
)
from domain.params import WritePolicy

WINDOW = 100.0
NOW = 1_000.0
USERS = [f"u{i}" for i in range(12)]


@st.composite
def conversations(draw: st.DrawFn) -> tuple[dict[str, float], Targets]:
    """Members (user -> last_active: never, long ago, or within the window) and one message's targets."""
    users = draw(st.lists(st.sampled_from(USERS), min_size=1, max_size=len(USERS), unique=True))
    activity = st.sampled_from([0.0, 1.0, NOW - WINDOW - 0.5, NOW - WINDOW, NOW - 1.0, NOW])
    members = {u: draw(activity) for u in users}
    sender = draw(st.sampled_from(users))
    members[sender] = NOW  # sending is activity, as the aggregate records it
    mentions = tuple(draw(st.lists(st.sampled_from(USERS), max_size=4, unique=True)))
    reply_to = draw(st.one_of(st.none(), st.sampled_from(USERS)))
    targets = Targets(
        sender=sender,
        mentions=mentions,
        reply_to_user=reply_to,
        mention_all=draw(st.booleans()),
        announcement=draw(st.booleans()),
    )
    return members, targets


def active(last: float) -> bool:
    return last > 0.0 and NOW - last <= WINDOW


@given(conversations())
def test_in_always_every_member_gets_an_entry(case):
    members, targets = case
    got = list(materialized_members(WritePolicy.ALWAYS, members, targets, NOW, WINDOW))
    assert sorted(got) == sorted(members)


@given(conversations())
def test_in_mention_only_active_mentioned_reply_target_and_sender_get_an_entry(case):
    members, targets = case
    got = list(materialized_members(WritePolicy.MENTION_ONLY, members, targets, NOW, WINDOW))
    assert len(got) == len(set(got))
    if targets.mention_all or targets.announcement:
        expected = set(members)
    else:
        wanted = {*targets.mentions, targets.sender}
        if targets.reply_to_user is not None:
            wanted.add(targets.reply_to_user)
        expected = {u for u, last in members.items() if active(last)} | (wanted & set(members))
    assert set(got) == expected


@given(conversations())
def test_in_mention_only_a_silent_member_that_is_not_targeted_gets_nothing(case):
    members, targets = case
    got = set(materialized_members(WritePolicy.MENTION_ONLY, members, targets, NOW, WINDOW))
    for u, last in members.items():
        targeted = u in targets.mentions or u == targets.reply_to_user or u == targets.sender
        if not active(last) and not targeted and not targets.broadcast:
            assert u not in got


@given(conversations(), st.sampled_from(list(WritePolicy)))
def test_every_member_a_message_mentions_is_materialized_in_every_policy(case, policy):
    """So mention_count can stay exact (invariant M)."""
    members, targets = case
    got = set(materialized_members(policy, members, targets, NOW, WINDOW))
    for u in members:
        if targets.flags_for(u) & MENTION_FLAGS:
            assert u in got


@given(conversations())
def test_flags_say_exactly_why_a_member_is_mentioned(case):
    members, targets = case
    for u in members:
        flags = targets.flags_for(u)
        own = u == targets.sender
        assert bool(flags & OWN) == own
        assert bool(flags & MENTION) == (u in targets.mentions and not own)
        assert bool(flags & REPLY) == (u == targets.reply_to_user and not own)
        assert bool(flags & MENTION_ALL) == targets.mention_all
        assert bool(flags & ANNOUNCEMENT) == targets.announcement


@given(conversations())
def test_personal_targets_never_include_the_sender(case):
    _, targets = case
    assert targets.sender not in targets.personal()
    assert targets.personal() == ({*targets.mentions, targets.reply_to_user} - {None, targets.sender})
