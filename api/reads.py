"""Reads of the API that run in the executor (blocking): waiting for the views to hold
a position (read-your-writes, ADR-0010 / README "Fresh reads"), reading through a miss
right after a write, and the composed reads of the handlers (history, delivery records,
capacity, projections). The handlers in api/views.py and the WebSocket in api/ws.py call
these; nothing here knows HTTP."""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

from api.metrics import capacity_rates
from domain.errors import InvalidArgument, NotAMember, NotFound, Unavailable
from domain.params import WritePolicy
from domain.policy import TierTerms, alpha_of, decide, equivalent_threshold, read_diffusion_saving
from domain.review import check_alpha_parameters
from fanout.queries import alpha_report_of
from fanout.runtime import Runtime
from fanout.wire import review_dict

READ_THROUGH_TIMEOUT = 2.0
REBUILD_TIMEOUT = 10.0
# Read-your-writes: every write answers its log position in this header (and `position`
# in its body); a read given min_position (query) or this header waits for the views.
POSITION_HEADER = "X-Fanout-Position"
MIN_POSITION_HEADER = "X-Fanout-Min-Position"

_waiting: weakref.WeakKeyDictionary[Runtime, int] = weakref.WeakKeyDictionary()
_waiting_lock = threading.Lock()


# -- blocking helpers (run in the executor) ------------------------------------


def projected(
    rt: Runtime, position: int | None = None, timeout: float = READ_THROUGH_TIMEOUT, partition: int | None = None
) -> bool:
    """The one wait for the views: until the projector has applied `position` (default:
    the whole log as written now), at most `timeout` s. True once it has; False at the
    timeout, or at once when no projector runs (nothing would move the views). With a
    `partition` (`scope`: a read of one conversation), only that log partition must
    have applied it: a stalled other partition does not hold the read."""
    target = rt.log_position() if position is None else position
    if rt.position(partition) >= target:
        return True
    if not rt.running:
        return False
    with _waiting_lock:
        _waiting[rt] = _waiting.get(rt, 0) + 1
    try:
        return rt.wait_until(target, timeout, partition)
    finally:
        with _waiting_lock:
            _waiting[rt] -= 1


def waiting_reads(rt: Runtime) -> int:
    """Requests waiting in `projected` now (shown by /v1/admin/projections)."""
    with _waiting_lock:
        return _waiting.get(rt, 0)


def scope(rt: Runtime, tenant: str, conversation_id: str) -> int | None:
    """The log partition a read of this one conversation waits for (its head, messages,
    delivery records, its members' read states are built from that partition's events
    only); None: the whole log (the embedded runtime)."""
    return rt.conversation_partition(tenant, conversation_id)


def fresh(rt: Runtime, min_position: int | None, partition: int | None = None) -> None:
    """A read that asked for min_position: wait (bounded by FANOUT_FRESH_READ_TIMEOUT)
    until the views (of `partition` only, when the read is of one conversation: `scope`)
    hold it; UNAVAILABLE (503, Retry-After) if they do not in time."""
    if min_position is None:
        return
    log_position = rt.log_position()
    if min_position > log_position:
        raise InvalidArgument(
            f"min_position {min_position} is beyond the log position {log_position}",
            field="min_position",
            log_position=log_position,
        )
    if not projected(rt, min_position, rt.params.fresh_read_timeout, partition):
        position = rt.position(partition)
        details: dict[str, Any] = {} if partition is None else {"partition": partition}
        raise Unavailable(
            f"the views are at log position {position}, not yet at min_position {min_position}; retry",
            position=position,
            min_position=min_position,
            log_position=log_position,
            projector_running=rt.running,
            retry_after_ms=1000,
            **details,
        )


def fresh_read(rt: Runtime, min_position: int | None, fn: Any, *args: Any, partition: int | None = None) -> Any:
    fresh(rt, min_position, partition)
    return fn(*args)


def read_through(rt: Runtime, fn: Any, *args: Any, partition: int | None = None) -> Any:
    """Read a view; on a miss, wait for the projection to catch up once and read again,
    so a caller reads its own writes (a conversation it just created, a join). A read of
    one conversation waits for its `partition` only."""
    try:
        return fn(*args)
    except (NotFound, NotAMember):
        # No "is it behind?" check first: the projector may commit between the miss and
        # that check (a flaky read-your-write seen in CI). Waiting when caught up is free.
        if not rt.running:
            raise
    projected(rt, partition=partition)
    return fn(*args)


def latest_seq(rt: Runtime, tenant: str, conversation_id: str) -> int:
    """The command side's conversation_seq: the authority on which seqs exist."""
    return int(rt.app.conversation(tenant, conversation_id).seq)


def check_seq_exists(rt: Runtime, tenant: str, conversation_id: str, seq: int, field: str) -> None:
    latest = latest_seq(rt, tenant, conversation_id)
    if seq > latest:
        raise InvalidArgument(
            f"{field} {seq} is beyond the latest conversation_seq {latest}",
            field=field,
            latest_conversation_seq=latest,
        )


def history(rt: Runtime, tenant: str, conversation_id: str, user_id: str, after_seq: int, limit: int) -> Any:
    partition = scope(rt, tenant, conversation_id)
    read_through(rt, rt.queries.require_member, tenant, conversation_id, user_id, partition=partition)
    check_seq_exists(rt, tenant, conversation_id, after_seq, "after_seq")
    return rt.queries.history(tenant, conversation_id, user_id, after_seq, limit)


def delivery(
    rt: Runtime, tenant: str, conversation_id: str, seq: int, min_position: int | None = None
) -> dict[str, Any]:
    fresh(rt, min_position, scope(rt, tenant, conversation_id))
    check_seq_exists(rt, tenant, conversation_id, seq, "seq")
    try:
        return rt.queries.delivery(tenant, conversation_id, seq)
    except NotFound:
        pass
    # Accepted, not projected yet: state pending, what the command side knows (its
    # MessageSent, read from the event store), materialized_at null until it is.
    sent = rt.app.history.sent_message(tenant, conversation_id, seq)
    if sent is None:  # the seq exists (checked above), so its event does
        raise NotFound(f"message {seq} of {conversation_id} not found", conversation_seq=seq)
    return rt.queries.pending_delivery(conversation_id, sent)


def conversation_sessions(rt: Runtime, tenant: str, user_id: str, conversation_id: str) -> dict[str, Any]:
    sessions, big = rt.queries.session_list(tenant, user_id)
    return {
        "sessions": [s for s in sessions if s["conversation_id"] == conversation_id],
        "big_group_heads": [h for h in big if h["conversation_id"] == conversation_id],
    }


def rebuild(rt: Runtime, tenant: str, conversation_id: str, user_id: str) -> dict[str, Any]:
    """REBUILD, then the conversation's fresh session item once it is projected."""
    result = rt.app.request_rebuild(tenant, conversation_id, user_id)
    projected(rt, result["position"], REBUILD_TIMEOUT, scope(rt, tenant, conversation_id))
    return {**result, **conversation_sessions(rt, tenant, user_id, conversation_id)}


def review(rt: Runtime, tenant: str, review_id: str) -> dict[str, Any]:
    return review_dict(rt.app.review(tenant, review_id))  # app.review takes the command lock


def review_list(rt: Runtime, tenant: str, min_position: int | None = None) -> list[dict[str, Any]]:
    if min_position is None:
        projected(rt)
    else:
        fresh(rt, min_position)
    return rt.queries.reviews(tenant)


def capacity(rt: Runtime, tenant: str) -> dict[str, Any]:
    p = rt.params
    rates = capacity_rates(rt)
    firing = dict(rt.capacity().firing)
    fanout_rate, large_rate = rates["fanout_entries_per_sec"], rates["large_group_entries_per_sec"]
    alpha = rt.queries.alpha_by_bucket(tenant)
    return {
        "scopes": scopes(rt, tenant),
        # Entries/s and budgets are platform-wide (T1/T2 watch the platform); alpha is this tenant's.
        "window_s": p.capacity_window,
        "fanout_entries_per_sec": fanout_rate,
        "large_group_entries_per_sec": large_rate,
        "platform_fanout_budget": p.platform_fanout_budget,
        "mailbox_write_budget": p.mailbox_write_budget,
        "budget_use": {
            "platform_fanout": fanout_rate / p.platform_fanout_budget,
            "mailbox_write_large_groups": large_rate / p.mailbox_write_budget,
        },
        "triggers": {
            "T1": {"firing": bool(firing.get("T1", False)), "threshold_ratio": p.t1_ratio},
            "T2": {"firing": bool(firing.get("T2", False)), "threshold_ratio": p.t2_ratio},
        },
        "alpha_by_bucket": {
            b: {k: v for k, v in summary.items() if k != "per_conversation"} for b, summary in alpha.items()
        },
    }


def scopes(rt: Runtime, tenant: str) -> list[dict[str, Any]]:
    """Who carries the window's entries/s: this tenant's size buckets, largest first, and
    every other tenant as one line (another tenant's ids do not exist for an admin, ADR-0008)."""
    w = rt.params.capacity_window
    per = dict(rt.capacity().per_scope)
    total = sum(per.values())
    mine = sorted(
        ((key.split("\x1f", 1)[1], n) for key, n in per.items() if key.split("\x1f", 1)[0] == tenant),
        key=lambda x: -x[1],
    )
    out: list[dict[str, Any]] = [
        {"tenant": tenant, "size_bucket": b, "entries_per_sec": n / w, "share": n / total} for b, n in mine
    ]
    others = total - sum(n for _, n in mine)
    if others:
        out.append({"tenant": None, "size_bucket": None, "entries_per_sec": others / w, "share": others / total})
    return out


def projections(rt: Runtime) -> dict[str, Any]:
    log_position = rt.log_position()
    positions = rt.projections_status()
    return {
        "log_position": log_position,
        "running": rt.running,
        "waiting_reads": waiting_reads(rt),
        "projections": [
            {
                "name": name,
                "partition": partition,
                "position": position,
                "log_position": log_position,
                "lag": max(0, log_position - position),
                "running": rt.running,
                "last_error": rt.last_error,
            }
            for (name, partition), position in sorted(positions.items())
        ],
    }


def finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def alpha(rt: Runtime, tenant: str, min_saving: float | None, max_active_ratio: float | None) -> dict[str, Any]:
    """`fanout analyze alpha` for the tenant (fanout/queries.py alpha_report_of, the same
    numbers), each conversation with its write_policy and when it last switched."""
    if (min_saving is None) != (max_active_ratio is None):
        raise InvalidArgument(
            "give both read_diffusion_min_saving and read_diffusion_max_active_ratio, or neither",
            field="read_diffusion_min_saving" if min_saving is None else "read_diffusion_max_active_ratio",
        )
    if min_saving is not None:
        check_alpha_parameters(min_saving, max_active_ratio)
    projected(rt)
    report = alpha_report_of(
        rt.views, rt.params, tenant=tenant, min_saving=min_saving, max_active_ratio=max_active_ratio
    )
    for bucket in report["buckets"]:
        bucket["n_eq_at_mean_alpha"] = finite(bucket["n_eq_at_mean_alpha"])
        for c in bucket["per_conversation"]:
            if "n_eq" in c:
                c["n_eq"] = finite(c["n_eq"])  # alpha 1: N_eq is infinite (JSON has no Infinity)
            head = rt.views.head(tenant, c["conversation_id"]) or {}
            c["write_policy"] = head.get("write_policy", WritePolicy.ALWAYS.value)
            c["last_switch_at"] = rt.app.conversation(tenant, c["conversation_id"]).last_switch_at
    return report


def preview(rt: Runtime, tenant: str, review_id: str, min_saving: float, max_active_ratio: float) -> dict[str, Any]:
    """What deciding this review enable_mention_only with these parameters would do now,
    written nowhere: the tier decision's own rule (domain/policy.py `decide`) applied to each
    conversation of the review's scope as the command side holds it (members, their activity,
    the last switch), exactly as `decide_review` will evaluate them."""
    check_alpha_parameters(min_saving, max_active_ratio)
    r = rt.app.review(tenant, review_id)
    bucket = r.size_bucket
    terms = TierTerms(True, float(min_saving), float(max_active_ratio))
    now = rt.app.clock()
    projected(rt)  # the scope as the tier decision will list it
    conversations: list[dict[str, Any]] = []
    members_in_scope = 0
    for cid in sorted(rt.views.heads_by_scope(tenant, bucket)):
        conv = rt.app.conversation(tenant, cid)
        n, a = alpha_of(conv.members.values(), now, rt.params.activity_window)
        members_in_scope += n
        switch = decide(conv.policy, terms, n, a, now, conv.last_switch_at, rt.params)
        silent = n - round(a * n)
        conversations.append(
            {
                "conversation_id": cid,
                "members": n,
                "alpha": a,
                "write_policy": conv.write_policy,
                "last_switch_at": conv.last_switch_at,
                "n_eq": finite(equivalent_threshold(float(min_saving), a)),
                "saving_per_message": read_diffusion_saving(n, a),
                "switches": switch is not None and switch.to is WritePolicy.MENTION_ONLY,
                "reason": switch.reason if switch is not None else None,
                "members_estimated": silent,
            }
        )
    switching = [c for c in conversations if c["switches"]]
    window = rt.capacity()
    scope_rate = dict(window.per_scope).get(f"{tenant}\x1f{bucket}", 0) / rt.params.capacity_window
    saved_share = sum(c["saving_per_message"] for c in switching) / members_in_scope if members_in_scope else 0.0
    return {
        "review_id": review_id,
        "tenant": tenant,
        "size_bucket": bucket,
        "read_diffusion_min_saving": float(min_saving),
        "read_diffusion_max_active_ratio": float(max_active_ratio),
        "at": now,
        "conversations": conversations,
        "switching": [c["conversation_id"] for c in switching],
        "members_estimated_unread": sum(c["members_estimated"] for c in switching),
        "saving_per_message": sum(c["saving_per_message"] for c in switching),
        "scope_entries_per_sec": scope_rate,
        "entries_per_sec_saved": scope_rate * saved_share,
        "basis": (
            "entries/s saved = the scope's entries/s over the capacity window x (sum of N x (1 - alpha) over the "
            "conversations that switch) / (members of the scope's conversations): messages per member assumed "
            "even across the scope"
        ),
    }
