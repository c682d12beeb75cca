"""UserConversationState, derived so that the O(N) write of a message is the
mailbox reference alone (docs/adr/0002-derived-unread-and-gaps.md).

A member's row changes only on its own actions (join, send, MARK_READ, REBUILD),
on a personal mention, and on a *transition* between being materialized and being
skipped (mention_only, silent). Unread, mention count, unread_exact and
delivered_conversation_seq are computed at read time from the row and the head."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(slots=True)
class UserConversationState:
    read_conversation_seq: int
    joined_seq: int
    last_active: float = 0.0
    # Gap: the mailbox is complete up to delivered_conversation_seq; (delivered_conversation_seq, gap_end] may miss entries.
    delivered_conversation_seq: int | None = None
    skipping: bool = False  # currently skipped (gap open-ended to latest)
    gap_end: int | None = None
    rebuilt_seq: int = 0  # REBUILD recomputed counts as of this seq
    mention_seqs: list[int] = field(default_factory=list)  # personal mentions/replies after read_conversation_seq
    broadcast_base: int = 0  # broadcasts (@all, announcements) with seq <= read_conversation_seq

    def row(self) -> dict[str, Any]:
        return {
            "read_conversation_seq": self.read_conversation_seq,
            "joined_seq": self.joined_seq,
            "last_active": self.last_active,
            "delivered_conversation_seq": self.delivered_conversation_seq,
            "skipping": int(self.skipping),
            "gap_end": self.gap_end,
            "rebuilt_seq": self.rebuilt_seq,
            "mention_seqs": ",".join(map(str, self.mention_seqs)),
            "broadcast_base": self.broadcast_base,
        }

    @classmethod
    def from_row(cls, r: Any) -> UserConversationState:
        ms = r["mention_seqs"]
        return cls(
            read_conversation_seq=r["read_conversation_seq"],
            joined_seq=r["joined_seq"],
            last_active=r["last_active"],
            delivered_conversation_seq=r["delivered_conversation_seq"],
            skipping=bool(r["skipping"]),
            gap_end=r["gap_end"],
            rebuilt_seq=r["rebuilt_seq"],
            mention_seqs=[int(x) for x in ms.split(",")] if ms else [],
            broadcast_base=r["broadcast_base"],
        )


ACTIVITY_BUCKET = 3600.0  # seconds: the login index's granularity (ADR-0028)


def activity_bucket(at: float | None) -> int:
    """The login index bucket of a last activity time (hours since the epoch)."""
    return int((at or 0.0) // ACTIVITY_BUCKET)


class SessionHead(NamedTuple):
    """What the session list shows of a ConversationHead (the login's batched read)."""

    conversation_id: str
    write_policy: str
    latest_conversation_seq: int
    broadcasts: int
    last_activity_id: str | None
    last_activity_at: float | None
    preview: str | None


class SessionState(NamedTuple):
    """What the session list needs of a UserConversationState: the counts' inputs, with
    the personal mentions as a number (a login reads thousands of these)."""

    read_conversation_seq: int
    delivered_conversation_seq: int | None
    skipping: bool
    gap_end: int | None
    rebuilt_seq: int
    personal_mentions: int
    broadcast_base: int

    @classmethod
    def of(cls, s: UserConversationState) -> SessionState:
        return cls(
            s.read_conversation_seq,
            s.delivered_conversation_seq,
            s.skipping,
            s.gap_end,
            s.rebuilt_seq,
            len(s.mention_seqs),
            s.broadcast_base,
        )


SessionItem = tuple[SessionHead, SessionState]  # a login's session item: a head and the state in it


def sessions_by_two_reads(reader: Any, tenant: str, user_id: str, batch: int) -> Iterator[list[SessionItem]]:
    """The login read as two reads, for stores without joins (memory, CQL): the user's
    states (one partition), then one batched read of their heads in activity order."""
    states = reader.user_states(tenant, user_id)
    for heads in reader.heads(tenant, list(states), batch):
        yield [(h, SessionState.of(states[h.conversation_id])) for h in heads]


def unread_exact(
    latest: int, read_seq: int, rebuilt_seq: int, delivered_seq: int | None, skipping: bool, gap_end: int | None
) -> bool:
    """`unread_exact` (ADR 0002): the mailbox has no gap, or the member has read (or
    REBUILT) past its end; an open gap (still skipping) ends at latest."""
    return delivered_seq is None or max(read_seq, rebuilt_seq) >= (latest if skipping else (gap_end or 0))


def session_item(head: SessionHead, state: SessionState) -> dict[str, Any]:
    """One sessions[] item of SESSION_LIST_BATCH: the conversation's head and the
    user's state in it."""
    latest, read, delivered, policy = (
        head.latest_conversation_seq,
        state.read_conversation_seq,
        state.delivered_conversation_seq,
        head.write_policy,
    )
    # With send-marks-read and state dropped on leave, every message after read_conversation_seq
    # was sent to this member by someone else (ADR 0002): unread is latest - read.
    exact = unread_exact(latest, read, state.rebuilt_seq, delivered, state.skipping, state.gap_end)
    item: dict[str, Any] = {
        "conversation_id": head.conversation_id,
        "write_policy": policy,
        "latest_conversation_seq": latest,
        "read_conversation_seq": read,
        "unread_count": latest - read if latest > read else 0,
        "unread_exact": exact,
        "mention_count": state.personal_mentions + head.broadcasts - state.broadcast_base,
        "last_activity_id": head.last_activity_id,
        "preview": head.preview,
    }
    if delivered is not None or policy == "mention_only" or not exact:
        item["delivered_conversation_seq"] = latest if delivered is None else delivered
    return item
