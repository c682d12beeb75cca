"""UserConversationState, derived so that the O(N) write of a message is the
mailbox reference alone (docs/adr/0002-derived-unread-and-gaps.md).

A member's row changes only on its own actions (join, send, MARK_READ, REBUILD),
on a personal mention, and on a *transition* between being materialized and being
skipped (mention_only, silent). Unread, mention count, unread_exact and
delivered_conversation_seq are computed at read time from the row and the head."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class MemberState:
    read_seq: int
    joined_seq: int
    last_active: float = 0.0
    # Gap: the mailbox is complete up to delivered_seq; (delivered_seq, gap_end] may miss entries.
    delivered_seq: int | None = None
    skipping: bool = False  # currently skipped (gap open-ended to latest)
    gap_end: int | None = None
    rebuilt_seq: int = 0  # REBUILD recomputed counts as of this seq
    mention_seqs: list[int] = field(default_factory=list)  # personal mentions/replies after read_seq
    broadcast_base: int = 0  # broadcasts (@all, announcements) with seq <= read_seq

    def row(self) -> dict[str, Any]:
        return {
            "read_seq": self.read_seq,
            "joined_seq": self.joined_seq,
            "last_active": self.last_active,
            "delivered_seq": self.delivered_seq,
            "skipping": int(self.skipping),
            "gap_end": self.gap_end,
            "rebuilt_seq": self.rebuilt_seq,
            "mention_seqs": ",".join(map(str, self.mention_seqs)),
            "broadcast_base": self.broadcast_base,
        }

    @classmethod
    def from_row(cls, r: Any) -> MemberState:
        ms = r["mention_seqs"]
        return cls(
            read_seq=r["read_seq"],
            joined_seq=r["joined_seq"],
            last_active=r["last_active"],
            delivered_seq=r["delivered_seq"],
            skipping=bool(r["skipping"]),
            gap_end=r["gap_end"],
            rebuilt_seq=r["rebuilt_seq"],
            mention_seqs=[int(x) for x in ms.split(",")] if ms else [],
            broadcast_base=r["broadcast_base"],
        )


def session_view(state: Any, head: Any, write_policy: str) -> dict[str, Any]:
    """One sessions[] item of SESSION_LIST_BATCH, from a state row and its head."""
    latest = head["latest_conversation_seq"]
    read_seq = state["read_seq"]
    delivered = state["delivered_seq"]
    gap_end = latest if state["skipping"] else state["gap_end"]
    exact = delivered is None or max(read_seq, state["rebuilt_seq"]) >= (gap_end or 0)
    ms = state["mention_seqs"]
    personal = len(ms.split(",")) if ms else 0
    item: dict[str, Any] = {
        "conversation_id": head["conversation_id"],
        "write_policy": write_policy,
        "latest_conversation_seq": latest,
        "read_conversation_seq": read_seq,
        # With send-marks-read and state dropped on leave, every message after
        # read_seq was sent to this member by someone else (ADR 0002).
        "unread_count": max(0, latest - read_seq),
        "unread_exact": exact,
        "mention_count": personal + head["broadcasts"] - state["broadcast_base"],
        "last_activity_id": head["last_activity_id"],
        "preview": head["preview"],
    }
    if write_policy == "mention_only" or not exact or delivered is not None:
        item["delivered_conversation_seq"] = latest if delivered is None else delivered
    return item
