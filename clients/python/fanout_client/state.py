"""The state a client keeps and an app shows: per conversation the latest and read seqs,
unread (exact or an estimate), mentions, write policy, the seqs held as merged ranges and
the gaps still open; per user the mailbox cursor. Pure: frames and answers in, no I/O.

Counts follow PROTOCOL's session fields: `unread = latest - read` always, exact only while
the server says so (`unread_exact`); the server's `mention_count` is taken at every session
list, and a live message newer than anything the list counted adds to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fanout_client.models import HeadFrame, MailboxEntry, Message, Session, WritePolicy
from fanout_client.ranges import Range, RangeSet


@dataclass
class ConversationState:
    conversation_id: str
    latest_seq: int = 0
    read_seq: int = 0
    unread_exact: bool = True
    mentions: int = 0
    write_policy: WritePolicy = "always"
    # Every seq after `floor` up to latest belongs to this member: those not held are gaps.
    # First set from the session item (the read seq, or the delivered seq when lower: the
    # member's history cannot start after what it has read), lowered by anything held below.
    floor: int = 0
    held: RangeSet = field(default_factory=RangeSet)
    mention_seqs: set[int] = field(default_factory=set)  # seqs after read_seq known to count as mentions
    last_activity_id: str | None = None
    preview: str | None = None

    @property
    def unread(self) -> int:
        return max(0, self.latest_seq - self.read_seq)

    def gaps(self) -> list[Range]:
        """The seqs of this member not held: what PULL_HISTORY must fetch."""
        return self.held.missing(self.floor + 1, self.latest_seq)

    def hold(self, seq: int) -> bool:
        """Hold one seq; True when it was new (a repeated frame is a no-op: de-duplication by seq)."""
        new = self.held.add(seq)
        self.floor = min(self.floor, seq - 1)
        return new

    def apply_session(self, s: Session, first_sight: bool) -> None:
        if first_sight:
            delivered = s.delivered_conversation_seq
            self.floor = s.read_conversation_seq if delivered is None else min(s.read_conversation_seq, delivered)
            lowest = self.held.lowest()
            if lowest is not None:
                self.floor = min(self.floor, lowest - 1)
        self.write_policy = s.write_policy
        self.latest_seq = max(self.latest_seq, s.latest_conversation_seq)
        self.read_seq = max(self.read_seq, s.read_conversation_seq)
        self.unread_exact = s.unread_exact
        self.mention_seqs = {m for m in self.mention_seqs if m > self.read_seq}
        self.mentions = s.mention_count if self.read_seq == s.read_conversation_seq else len(self.mention_seqs)
        if s.latest_conversation_seq >= self.latest_seq:
            self.last_activity_id, self.preview = s.last_activity_id, s.preview

    def apply_entry(self, e: MailboxEntry) -> None:
        self.hold(e.conversation_seq)
        if e.mention and e.conversation_seq > self.read_seq:
            self.mention_seqs.add(e.conversation_seq)

    def apply_message(self, m: Message, user_id: str, live: bool) -> bool:
        """A message body (live or pulled); True when its seq was not held before."""
        newer = m.conversation_seq > self.latest_seq
        new = self.hold(m.conversation_seq)
        if newer:
            self.latest_seq = m.conversation_seq
            self.last_activity_id, self.preview = m.message_id, m.text[:80]
        if m.sender == user_id:  # sending marks read (ADR-0002 1)
            self.read_seq = max(self.read_seq, m.conversation_seq)
        elif live and newer and mentions(m, user_id):
            self.mentions += 1
            self.mention_seqs.add(m.conversation_seq)
        return new

    def apply_head(self, h: HeadFrame) -> None:
        if h.latest_conversation_seq > self.latest_seq:
            self.latest_seq = h.latest_conversation_seq
            self.last_activity_id, self.preview = h.last_activity_id, h.preview

    def apply_read(self, read_seq: int) -> None:
        """READ_OK: to latest, the counts are exact again (PROTOCOL, invariant U)."""
        known_read = len({m for m in self.mention_seqs if m <= read_seq})
        self.read_seq = max(self.read_seq, read_seq)
        self.mention_seqs = {m for m in self.mention_seqs if m > self.read_seq}
        if self.read_seq >= self.latest_seq:
            self.unread_exact, self.mentions = True, 0
        else:
            self.mentions = max(0, self.mentions - known_read)

    def line(self) -> dict[str, Any]:
        """What an app shows (and `fanout-client sync` prints), in one flat object."""
        return {
            "conversation_id": self.conversation_id,
            "latest_seq": self.latest_seq,
            "read_seq": self.read_seq,
            "unread": self.unread,
            "unread_exact": self.unread_exact,
            "mentions": self.mentions,
            "write_policy": self.write_policy,
            "held": self.held.as_lists(),
            "gaps": [list(g) for g in self.gaps()],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "latest_seq": self.latest_seq,
            "read_seq": self.read_seq,
            "unread_exact": self.unread_exact,
            "mentions": self.mentions,
            "write_policy": self.write_policy,
            "floor": self.floor,
            "held": self.held.as_lists(),
            "mention_seqs": sorted(self.mention_seqs),
            "last_activity_id": self.last_activity_id,
            "preview": self.preview,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ConversationState:
        return cls(
            conversation_id=d["conversation_id"],
            latest_seq=d["latest_seq"],
            read_seq=d["read_seq"],
            unread_exact=d["unread_exact"],
            mentions=d["mentions"],
            write_policy=d["write_policy"],
            floor=d["floor"],
            held=RangeSet(d["held"]),
            mention_seqs=set(d["mention_seqs"]),
            last_activity_id=d["last_activity_id"],
            preview=d["preview"],
        )


def mentions(m: Message, user_id: str) -> bool:
    """Counts as a mention of `user_id` as far as the message alone tells (a reply to the
    user's own message is counted by the server at the next session list)."""
    return user_id in m.mentions or m.mention_all or m.announcement


@dataclass
class ClientState:
    """One user's state on one device: what a store keeps."""

    tenant: str | None = None
    user_id: str | None = None
    cursor: int = 0  # the mailbox's next_after: entries after it are still to read
    conversations: dict[str, ConversationState] = field(default_factory=dict)

    def conversation(self, conversation_id: str) -> ConversationState:
        c = self.conversations.get(conversation_id)
        if c is None:
            c = self.conversations[conversation_id] = ConversationState(conversation_id)
        return c

    def lines(self) -> list[dict[str, Any]]:
        return [self.conversations[cid].line() for cid in sorted(self.conversations)]
