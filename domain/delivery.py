"""Who gets a mailbox reference for a message (ADR decision 4, minimal change set d/e).

One rule, used by the Conversation aggregate (to charge the tenant fan-out quota
with the exact number of entries) and by the mailbox projection (to write them),
so the two can never disagree."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from domain.params import WritePolicy
from domain.policy import is_active

# UserMailboxEntry flags
MENTION = 1  # @mention of this user
REPLY = 2  # a reply to a message this user sent
ANNOUNCEMENT = 4  # group announcement
MENTION_ALL = 8  # @all
OWN = 16  # the recipient is the sender

MENTION_FLAGS = MENTION | REPLY | ANNOUNCEMENT | MENTION_ALL


@dataclass(frozen=True)
class Targets:
    """What makes a message count as a mention for a member."""

    sender: str
    mentions: tuple[str, ...] = ()
    reply_to_user: str | None = None
    mention_all: bool = False
    announcement: bool = False

    @property
    def broadcast(self) -> bool:
        return self.mention_all or self.announcement

    def personal(self) -> set[str]:
        """Members this message mentions personally (excluding the sender)."""
        out = set(self.mentions)
        if self.reply_to_user is not None:
            out.add(self.reply_to_user)
        out.discard(self.sender)
        return out

    def flags_for(self, user_id: str) -> int:
        flags = 0
        if user_id in self.mentions and user_id != self.sender:
            flags |= MENTION
        if self.reply_to_user == user_id and user_id != self.sender:
            flags |= REPLY
        if self.announcement:
            flags |= ANNOUNCEMENT
        if self.mention_all:
            flags |= MENTION_ALL
        if user_id == self.sender:
            flags |= OWN
        return flags


def materialized_members(
    policy: WritePolicy,
    members: Mapping[str, float],
    targets: Targets,
    at: float,
    window: float,
) -> Iterable[str]:
    """Members that get a UserMailboxEntry. `members` maps user -> last_active.

    always: everyone. mention_only: active members, plus anyone the message
    mentions, replies to, @all or announcement (those stay exact in every policy)."""
    if policy is WritePolicy.ALWAYS or targets.broadcast:
        return members.keys()
    personal = targets.personal()
    personal.add(targets.sender)
    return [m for m, t in members.items() if m in personal or is_active(t, at, window)]
