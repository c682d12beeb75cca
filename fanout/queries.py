"""The query side used by the API, the WebSocket sync and the CLI: reads of the views
(through the ViewReader port, whatever the engine) shaped as the contract of SPEC
section 6. No writes here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from domain.conversation import Conversation
from domain.delivery import MENTION_FLAGS
from domain.errors import InvalidArgument, NotAMember, NotFound
from domain.params import Parameters, SizeBucket
from domain.policy import alpha_of, equivalent_threshold, meets_enter_criterion, read_diffusion_saving
from projections.ports import ViewReader
from projections.state import SessionItem, session_item

SESSION_BATCH = 500
MAX_PAGE = 1000


class Queries:
    def __init__(self, views: ViewReader, params: Parameters) -> None:
        self.views = views
        self.params = params

    # -- login sync ------------------------------------------------------------

    def session_batches(self, tenant: str, user_id: str, size: int = SESSION_BATCH) -> Iterator[dict[str, Any]]:
        """SESSION_LIST_BATCH frames, most recent activity first, produced lazily so the
        first frame goes out before the rest is read. BIG_GROUP_HEADS (the user's
        mention_only groups) ride the same frames (ADR minimal change set b)."""
        for batch, last in self._session_lists(tenant, user_id, size):
            sessions = [session_item(h, st) for h, st in batch]
            big = [
                {
                    "conversation_id": s["conversation_id"],
                    "latest_conversation_seq": s["latest_conversation_seq"],
                    "last_activity_id": s["last_activity_id"],
                    "preview": s["preview"],
                    "unread_estimate": s["unread_count"],
                }
                for s in sessions
                if s["write_policy"] == "mention_only"
            ]
            yield {"type": "SESSION_LIST_BATCH", "sessions": sessions, "big_group_heads": big, "last": last}

    def _session_lists(self, tenant: str, user_id: str, size: int) -> Iterator[tuple[list[SessionItem], bool]]:
        """(a list of sessions, whether it is the last), at least one (empty when the user
        has no conversation). The first list the store's quick way when it has one (the
        login index, ADR-0028): it goes out before the rest (every state, every head) is
        read; otherwise each list once the next one is read (the `last` flag needs it)."""
        quick = self.views.first_sessions(tenant, user_id, size)
        if quick is not None:
            first, complete = quick
            if complete:
                yield from _marked_last(first, size)
                return
            yield first[:size], False
            sent = {h.conversation_id for h, _ in first[:size]}
            rest = [s for part in self.views.sessions(tenant, user_id, size) for s in part]
            rest = [s for s in rest if s[0].conversation_id not in sent]
            yield from _marked_last(rest, size)
            return
        pending: list[SessionItem] | None = None
        for part in self.views.sessions(tenant, user_id, size):
            if pending is not None:
                yield pending, False
            pending = part
        yield (pending if pending is not None else []), True

    def session_list(self, tenant: str, user_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(sessions[], big_group_heads[]) in one piece, for GET /v1/me/sessions."""
        sessions: list[dict[str, Any]] = []
        big: list[dict[str, Any]] = []
        for frame in self.session_batches(tenant, user_id):
            sessions.extend(frame["sessions"])
            big.extend(frame["big_group_heads"])
        return sessions, big

    # -- mailbox and history -------------------------------------------------

    def mailbox(self, tenant: str, user_id: str, after: int, limit: int) -> dict[str, Any]:
        _check_page(after, limit)
        rows = self.views.mailbox_page(tenant, user_id, after, limit)
        entries = [
            {
                "cursor": pos,
                "conversation_id": cid,
                "conversation_seq": seq,
                "mention": bool(flags & MENTION_FLAGS),
                "flags": flags,
            }
            for _user, pos, seq, cid, flags in rows
        ]
        return {"entries": entries, "next_after": rows[-1][1] if rows else after, "more": len(rows) == limit}

    def require_member(self, tenant: str, conversation_id: str, user_id: str) -> dict[str, Any]:
        if self.views.head(tenant, conversation_id) is None:
            raise NotFound(f"conversation {conversation_id} not found", conversation_id=conversation_id)
        state = self.views.state(tenant, user_id, conversation_id)
        if state is None:
            raise NotAMember(f"{user_id} is not a member of {conversation_id}", user_id=user_id)
        return state

    def history(self, tenant: str, conversation_id: str, user_id: str, after_seq: int, limit: int) -> dict[str, Any]:
        """PULL_HISTORY: messages after after_seq, for a member."""
        _check_page(after_seq, limit)
        self.require_member(tenant, conversation_id, user_id)
        msgs = self.views.messages(tenant, conversation_id, after_seq, limit)
        head = self.views.head(tenant, conversation_id) or {}
        return {
            "conversation_id": conversation_id,
            "messages": msgs,
            "latest_conversation_seq": head.get("latest_conversation_seq", 0),
            "more": len(msgs) == limit,
        }

    # -- heads and cost records --------------------------------------------------

    def head(self, tenant: str, conversation_id: str) -> dict[str, Any]:
        head = self.views.head(tenant, conversation_id)
        if head is None:
            raise NotFound(f"conversation {conversation_id} not found", conversation_id=conversation_id)
        return {
            "conversation_id": conversation_id,
            "title": head["title"],
            "latest_conversation_seq": head["latest_conversation_seq"],
            "last_activity_id": head["last_activity_id"],
            "preview": head["preview"],
            "member_count": head["member_count"],
            "size_bucket": head["size_bucket"],
            "write_policy": head["write_policy"],
        }

    def delivery(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any]:
        """The cost record (SPEC section 2): body O(1), head O(1), shards O(S),
        mailbox entries O(N), online pushes O(O)."""
        rec = self.views.delivery(tenant, conversation_id, seq)
        if rec is None:
            if self.views.head(tenant, conversation_id) is None:
                raise NotFound(f"conversation {conversation_id} not found", conversation_id=conversation_id)
            raise NotFound(f"message {seq} of {conversation_id} is not projected (yet)", conversation_seq=seq)
        return {
            "conversation_id": conversation_id,
            "conversation_seq": seq,
            "message_id": rec["message_id"],
            "write_policy": rec["write_policy"],
            "member_count": rec["member_count"],
            "body_writes": 1,
            "body_bytes": rec["body_bytes"],
            "head_writes": 1,
            "shards": rec["shards"],
            "mailbox_entries": rec["mailbox_entries"],
            "online_pushes": rec["online_pushes"] or 0,
            "materialized_at": rec["materialized_at"],
            "state": "materialized" if rec["materialized_at"] is not None else "pending",
        }

    @staticmethod
    def pending_delivery(conversation_id: str, sent: Conversation.MessageSent) -> dict[str, Any]:
        """The record of an accepted message the views have not applied yet: what the
        command side's MessageSent already says (mailbox_entries is the number the
        tenant quota was charged, which the projection materializes), the rest null."""
        return {
            "conversation_id": conversation_id,
            "conversation_seq": sent.seq,
            "message_id": sent.message_id,
            "write_policy": sent.write_policy,
            "member_count": sent.member_count,
            "body_writes": None,
            "body_bytes": None,
            "head_writes": None,
            "shards": None,
            "mailbox_entries": sent.fanout_entries,
            "online_pushes": None,
            "materialized_at": None,
            "state": "pending",
        }

    # -- admin -------------------------------------------------------------------

    def reviews(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's reviews as the views hold them."""
        return list(self.views.reviews(tenant))

    def alpha_by_bucket(self, tenant: str | None, now: float | None = None) -> dict[str, dict[str, Any]]:
        """alpha (active members / members) per conversation, summarized per size bucket."""
        now = time.time() if now is None else now
        per: dict[str, list[tuple[str, str, int, float]]] = {b.value: [] for b in SizeBucket}
        # The activity rule stays the domain's (alpha_of).
        for t, cid, bucket, actives in self.views.conversation_activity(tenant):
            n, alpha = alpha_of(actives, now, self.params.activity_window)
            per[bucket].append((t, cid, n, alpha))
        out = {}
        for bucket, rows in per.items():
            alphas = sorted(a for _, _, _, a in rows)
            out[bucket] = {
                "conversations": len(rows),
                "members": sum(n for _, _, n, _ in rows),
                "alpha_mean": sum(alphas) / len(alphas) if alphas else None,
                "alpha_p50": alphas[len(alphas) // 2] if alphas else None,
                "alpha_p90": alphas[min(len(alphas) - 1, int(len(alphas) * 0.9))] if alphas else None,
                "per_conversation": [
                    {"tenant": t, "conversation_id": c, "members": n, "alpha": a} for t, c, n, a in rows
                ],
            }
        return out

    @staticmethod
    def criterion(n: int, alpha: float, min_saving: float, max_active_ratio: float) -> dict[str, Any]:
        """The enter criterion of the ADR supplement for one conversation."""
        return {
            "saving": read_diffusion_saving(n, alpha),
            "n_eq": equivalent_threshold(min_saving, alpha),
            "meets": meets_enter_criterion(n, alpha, min_saving, max_active_ratio),
        }


def _check_page(after: int, limit: int) -> None:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidArgument("after must be a non-negative integer", field="after")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_PAGE}", field="limit")


def _marked_last(items: list[SessionItem], size: int) -> Iterator[tuple[list[SessionItem], bool]]:
    """`items` in lists of `size` (one empty list when none), each with whether it is the last."""
    lists = [items[i : i + size] for i in range(0, len(items), size)] or [[]]
    return ((part, i == len(lists) - 1) for i, part in enumerate(lists))
