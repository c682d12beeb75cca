"""The query side used by the API, the WebSocket sync and the CLI: reads of the views
(through the ViewReader port, whatever the engine) shaped as the contract of SPEC
section 6, and the reviewer's alpha report (`alpha_report_of`). No writes here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from domain.conversation import Conversation
from domain.delivery import MENTION_FLAGS
from domain.errors import InvalidArgument, NotAMember, NotFound
from domain.params import Parameters, SizeBucket
from domain.policy import alpha_of, equivalent_threshold, meets_enter_criterion, read_diffusion_saving
from domain.tier import Tier
from projections.ports import ViewReader
from projections.state import SessionItem, session_item

SESSION_BATCH = 500
# The first SESSION_LIST_BATCH holds a first screen, not a full frame: a client draws it while
# the rest comes, and the store reads (and the login index serves) 100 conversations, not 500,
# before it can go out (ADR-0028, amended on 2026-12-04 in 6fa6f65).
FIRST_SESSION_BATCH = 100
MAX_PAGE = 1000


class Queries:
    def __init__(self, views: ViewReader, params: Parameters) -> None:
        self.views = views
        self.params = params

    # -- login sync ------------------------------------------------------------

    def session_batches(
        self, tenant: str, user_id: str, size: int = SESSION_BATCH, first: int = FIRST_SESSION_BATCH
    ) -> Iterator[dict[str, Any]]:
        """SESSION_LIST_BATCH frames, most recent activity first, produced lazily so the
        first frame goes out before the rest is read: the first holds `first` sessions (a
        first screen; at most `size`), the others `size`. BIG_GROUP_HEADS (the user's
        mention_only groups) ride the same frames (ADR minimal change set b)."""
        for batch, last in self._session_lists(tenant, user_id, min(first, size), size):
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

    def _session_lists(
        self, tenant: str, user_id: str, first: int, size: int
    ) -> Iterator[tuple[list[SessionItem], bool]]:
        """(a list of sessions, whether it is the last), at least one (empty when the user
        has no conversation): `first` sessions, then `size` each. The first list the store's
        quick way when it has one (the login index, ADR-0028): it goes out before the rest
        (every state, every head) is read; otherwise each list once one more session is
        known to follow it (the `last` flag needs it)."""
        quick = self.views.first_sessions(tenant, user_id, first)
        if quick is not None:
            found, complete = quick
            if complete:
                yield from _framed(iter([found]), first, size)
                return
            yield found[:first], False
            sent = {h.conversation_id for h, _ in found[:first]}
            rest = [s for part in self.views.sessions(tenant, user_id, size) for s in part]
            yield from _framed(iter([[s for s in rest if s[0].conversation_id not in sent]]), size, size)
            return
        yield from _framed(self.views.sessions(tenant, user_id, size), first, size)

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

    def alpha_by_bucket(
        self, tenant: str | None, now: float | None = None, size_bucket: SizeBucket | None = None
    ) -> dict[str, dict[str, Any]]:
        """alpha (active members / members) per conversation, summarized per size bucket
        (that bucket's alone when given: the others' states are not read)."""
        now = time.time() if now is None else now
        buckets = list(SizeBucket) if size_bucket is None else [size_bucket]
        per: dict[str, list[tuple[str, str, int, float]]] = {b.value: [] for b in buckets}
        # The activity rule stays the domain's (alpha_of).
        only = None if size_bucket is None else size_bucket.value
        for t, cid, bucket, actives in self.views.conversation_activity(tenant, only):
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


def _framed(parts: Iterator[list[SessionItem]], first: int, size: int) -> Iterator[tuple[list[SessionItem], bool]]:
    """The sessions of `parts` (read lazily) in lists of `first`, then `size`, each with
    whether it is the last; a list goes once one more session is known to follow it (one
    empty list when there is none at all)."""
    buffered: list[SessionItem] = []
    want = first
    for part in parts:
        buffered.extend(part)
        while len(buffered) > want:
            yield buffered[:want], False
            buffered, want = buffered[want:], size
    yield buffered, True


# -- the reviewer's alpha report ----------------------------------------------------------


@dataclass(frozen=True)
class Terms:
    """The two review parameters an alpha report is read under, and where they come from."""

    min_saving: float
    max_active_ratio: float
    source: str  # "given" or "tier <review id>"


def _tier_terms(views: ViewReader, tenant: str, bucket: str) -> Terms | None:
    body = views.tier(str(Tier.create_id(tenant, bucket)))
    if body is None or not body.get("enabled"):
        return None
    return Terms(
        float(body["read_diffusion_min_saving"]),
        float(body["read_diffusion_max_active_ratio"]),
        f"tier (review {str(body.get('review_id'))[:8]})",
    )


def _review_terms(views: ViewReader, tenant: str, bucket: str) -> Terms | None:
    """The latest review of tenant x bucket decided with the two alpha parameters (its
    tier was since rolled back, or the review's tier is not enabled yet)."""
    found: Terms | None = None
    for body in views.reviews(tenant):
        params = body.get("decision_params") or {}
        if body.get("size_bucket") == bucket and {
            "read_diffusion_min_saving",
            "read_diffusion_max_active_ratio",
        } <= set(params):
            found = Terms(
                float(params["read_diffusion_min_saving"]),
                float(params["read_diffusion_max_active_ratio"]),
                f"review {str(body.get('review_id'))[:8]} (tier not enabled)",
            )
    return found


def alpha_report_of(
    views: ViewReader,
    params: Parameters,
    *,
    tenant: str | None = None,
    min_saving: float | None = None,
    max_active_ratio: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Per size bucket: conversations, members, alpha mean/p50/p90 and, under the given
    review parameters (else the enabled tier's, else the latest review decided with
    them), how many conversations meet the enter criterion, their total saving
    N x (1 - alpha), and N_eq at the bucket's mean alpha. `fanout analyze alpha`
    (tools/analyze.py) prints it and the console's alpha chart draws it (GET
    /v1/admin/alpha), so the CLI and the console show the same numbers."""
    now = time.time() if now is None else now
    q = Queries(views, params)
    tenants = [tenant] if tenant else views.tenants()
    given = Terms(min_saving, max_active_ratio, "given") if min_saving is not None else None  # type: ignore[arg-type]
    buckets: dict[str, dict[str, Any]] = {
        b.value: {"bucket": b.value, "conversations": [], "terms": set()} for b in SizeBucket
    }
    for t in tenants:
        per_bucket = q.alpha_by_bucket(t, now=now)
        for bucket, stats in per_bucket.items():
            terms = given or _tier_terms(views, t, bucket) or _review_terms(views, t, bucket)
            for c in stats["per_conversation"]:
                row = {"tenant": t, **c}
                if terms is not None:
                    crit = q.criterion(c["members"], c["alpha"], terms.min_saving, terms.max_active_ratio)
                    row.update(meets=crit["meets"], saving=crit["saving"], n_eq=crit["n_eq"])
                    buckets[bucket]["terms"].add(terms)
                buckets[bucket]["conversations"].append(row)
    rows = []
    for bucket, b in buckets.items():
        convs = b["conversations"]
        alphas = sorted(c["alpha"] for c in convs)
        mean = sum(alphas) / len(alphas) if alphas else None
        terms_set: set[Terms] = b["terms"]
        one = next(iter(terms_set)) if len(terms_set) == 1 else None
        meeting = [c for c in convs if c.get("meets")]
        rows.append(
            {
                "size_bucket": bucket,
                "conversations": len(convs),
                "members": sum(c["members"] for c in convs),
                "alpha_mean": mean,
                "alpha_p50": alphas[len(alphas) // 2] if alphas else None,
                "alpha_p90": alphas[min(len(alphas) - 1, int(len(alphas) * 0.9))] if alphas else None,
                "min_saving": one.min_saving if one else None,
                "max_active_ratio": one.max_active_ratio if one else None,
                "terms": one.source if one else ("mixed tiers" if terms_set else None),
                "meet_enter": len(meeting) if terms_set else None,
                "saving_meeting": sum(c["saving"] for c in meeting) if terms_set else None,
                "n_eq_at_mean_alpha": equivalent_threshold(one.min_saving, mean) if one and mean is not None else None,
                "per_conversation": convs,
            }
        )
    return {"at": now, "tenant": tenant, "buckets": rows}
