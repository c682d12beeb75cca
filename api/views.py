"""HTTP handlers (SPEC section 6). Each one: check who calls (by `@endpoint`), call the
application or the queries off the event loop, shape the answer. Errors are raised as
domain errors and turned into HTTP in one place (`api/errors.py`)."""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from aiohttp import web

from api import schemas
from api.endpoint import ADMIN, SERVICE, USER, endpoint
from api.errors import json_response
from api.keys import METRICS, RUNTIME, blocking
from api.metrics import CONTENT_TYPE, capacity_rates
from domain.errors import InvalidArgument, NotAMember, NotFound, Unavailable
from domain.params import SizeBucket
from fanout.application import review_dict
from fanout.runtime import Runtime
from fanout.security import Claims
from fanout.strict_json import INT64_MAX

READ_THROUGH_TIMEOUT = 2.0
REBUILD_TIMEOUT = 10.0
# Read-your-writes: every write answers its log position in this header (and `position`
# in its body); a read given min_position (query) or this header waits for the views.
POSITION_HEADER = "X-Fanout-Position"
MIN_POSITION_HEADER = "X-Fanout-Min-Position"

_waiting: weakref.WeakKeyDictionary[Runtime, int] = weakref.WeakKeyDictionary()
_waiting_lock = threading.Lock()


# -- blocking helpers (run in the executor) ------------------------------------


def projected(rt: Runtime, position: int | None = None, timeout: float = READ_THROUGH_TIMEOUT) -> bool:
    """The one wait for the views: until the projector has applied `position` (default:
    the whole log as written now), at most `timeout` s. True once it has; False at the
    timeout, or at once when no projector runs (nothing would move the views)."""
    target = rt.log_position() if position is None else position
    if rt.position() >= target:
        return True
    if not rt.running:
        return False
    with _waiting_lock:
        _waiting[rt] = _waiting.get(rt, 0) + 1
    try:
        return rt.wait_until(target, timeout)
    finally:
        with _waiting_lock:
            _waiting[rt] -= 1


def waiting_reads(rt: Runtime) -> int:
    """Requests waiting in `projected` now (shown by /v1/admin/projections)."""
    with _waiting_lock:
        return _waiting.get(rt, 0)


def fresh(rt: Runtime, min_position: int | None) -> None:
    """A read that asked for min_position: wait (bounded by FANOUT_FRESH_READ_TIMEOUT)
    until the views hold it; UNAVAILABLE (503, Retry-After) if they do not in time."""
    if min_position is None:
        return
    log_position = rt.log_position()
    if min_position > log_position:
        raise InvalidArgument(
            f"min_position {min_position} is beyond the log position {log_position}",
            field="min_position",
            log_position=log_position,
        )
    if not projected(rt, min_position, rt.params.fresh_read_timeout):
        position = rt.position()
        raise Unavailable(
            f"the views are at log position {position}, not yet at min_position {min_position}; retry",
            position=position,
            min_position=min_position,
            log_position=log_position,
            projector_running=rt.running,
            retry_after_ms=1000,
        )


def fresh_read(rt: Runtime, min_position: int | None, fn: Any, *args: Any) -> Any:
    fresh(rt, min_position)
    return fn(*args)


def read_through(rt: Runtime, fn: Any, *args: Any) -> Any:
    """Read a view; on a miss, wait for the projection to catch up once and read again,
    so a caller reads its own writes (a conversation it just created, a join)."""
    try:
        return fn(*args)
    except (NotFound, NotAMember):
        # No "is it behind?" check first: the projector may commit between the miss and
        # that check (a flaky read-your-write seen in CI). Waiting when caught up is free.
        if not rt.running:
            raise
    projected(rt)
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
    read_through(rt, rt.queries.require_member, tenant, conversation_id, user_id)
    check_seq_exists(rt, tenant, conversation_id, after_seq, "after_seq")
    return rt.queries.history(tenant, conversation_id, user_id, after_seq, limit)


def delivery(
    rt: Runtime, tenant: str, conversation_id: str, seq: int, min_position: int | None = None
) -> dict[str, Any]:
    fresh(rt, min_position)
    check_seq_exists(rt, tenant, conversation_id, seq, "seq")
    try:
        return rt.queries.delivery(tenant, conversation_id, seq)
    except NotFound:
        pass
    # Accepted, not projected yet: state pending, what the command side knows (its
    # MessageSent, read from the event store), materialized_at null until it is.
    sent = rt.app.sent_message(tenant, conversation_id, seq)
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
    projected(rt, result["position"], REBUILD_TIMEOUT)
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


def seq_param(request: web.Request, name: str = "seq") -> int:
    text = request.match_info[name]
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer", field=name) from None
    if not 1 <= value <= INT64_MAX:
        raise InvalidArgument(f"{name} must be a conversation_seq from 1 to {INT64_MAX}", field=name)
    return value


def reply(data: Any, status: int = 200) -> web.Response:
    return json_response(data, status=status)  # strict JSON: never NaN / Infinity


def written(result: dict[str, Any], status: int = 200) -> web.Response:
    """A write's answer: its log position in the body (`position`) and in X-Fanout-Position."""
    return json_response(result, status=status, headers={POSITION_HEADER: str(result["position"])})


def min_position(request: web.Request, data: Any) -> int | None:
    """min_position from the query (validated by its model) or X-Fanout-Min-Position;
    both given: the larger."""
    query = getattr(data, "min_position", None)
    header = request.headers.get(MIN_POSITION_HEADER)
    if header is None:
        return query
    try:
        value = int(header.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= INT64_MAX:
        raise InvalidArgument(
            f"{MIN_POSITION_HEADER} must be a log position (an integer from 0 to {INT64_MAX})", field=MIN_POSITION_HEADER
        )
    return value if query is None else max(value, query)


# -- operations ------------------------------------------------------------------


@endpoint("Process is up", roles=None)
async def healthz(request: web.Request, who: None, data: None) -> web.Response:
    return reply({"status": "ok"})


@endpoint("Projectors running and the event store reachable; 503 otherwise", roles=None)
async def readyz(request: web.Request, who: None, data: None) -> web.Response:
    rt = request.app[RUNTIME]

    def check() -> dict[str, Any]:
        log_position = rt.log_position()  # touches the event store
        return {"running": rt.running, "last_error": rt.last_error, "log_position": log_position}

    try:
        state = await blocking(request.app, check)
    except Exception as exc:  # an unreachable engine is "not ready", not an error of this request
        state = {"running": rt.running, "last_error": f"{type(exc).__name__}: {exc}"}
    ready = bool(state["running"]) and state["last_error"] is None
    return reply({"status": "ready" if ready else "not_ready", **state}, status=200 if ready else 503)


@endpoint("Prometheus metrics (text format)", roles=None)
async def metrics(request: web.Request, who: None, data: None) -> web.Response:
    body = await blocking(request.app, request.app[METRICS].render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


# -- service role -----------------------------------------------------------------


@endpoint("Create a conversation", roles=SERVICE, body=schemas.CreateConversation, ok=201)
async def create_conversation(request: web.Request, who: Claims, data: schemas.CreateConversation) -> web.Response:
    rt = request.app[RUNTIME]
    result = await blocking(
        request.app, rt.app.create_conversation, who.tenant, data.conversation_id, data.title, data.members
    )
    return written(result, status=201)


@endpoint("Add members (bulk)", roles=SERVICE, body=schemas.AddMembers)
async def add_members(request: web.Request, who: Claims, data: schemas.AddMembers) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    return written(await blocking(request.app, rt.app.add_members, who.tenant, cid, data.user_ids))


@endpoint("Remove a member", roles=SERVICE)
async def remove_member(request: web.Request, who: Claims, data: None) -> web.Response:
    rt = request.app[RUNTIME]
    cid, uid = request.match_info["cid"], request.match_info["uid"]
    return written(await blocking(request.app, rt.app.remove_member, who.tenant, cid, uid))


@endpoint(
    "Send a message",
    roles=SERVICE,
    body=schemas.SendMessage,
    ok=201,
    response=schemas.SendResult,
    description="201 for a new message; 200 for a retry with the same client_msg_id (same seq, no duplicate).",
)
async def send_message(request: web.Request, who: Claims, data: schemas.SendMessage) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    started = time.perf_counter()
    result = await blocking(
        request.app,
        rt.app.send_message,
        who.tenant,
        cid,
        sender=data.sender,
        text=data.text,
        mentions=data.mentions,
        mention_all=data.mention_all,
        reply_to_seq=data.reply_to_seq,
        announcement=data.announcement,
        client_msg_id=data.client_msg_id,
    )
    request.app[METRICS].send_seconds.observe(time.perf_counter() - started)
    duplicate = bool(result.pop("duplicate", False))
    return written(result, status=200 if duplicate else 201)


@endpoint("The conversation's head", roles=SERVICE, query=schemas.FreshQuery, errors=(503,))
async def get_conversation(request: web.Request, who: Claims, data: schemas.FreshQuery) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    at = min_position(request, data)
    if at is not None:
        return reply(await blocking(request.app, fresh_read, rt, at, rt.queries.head, who.tenant, cid))
    return reply(await blocking(request.app, read_through, rt, rt.queries.head, who.tenant, cid))


@endpoint(
    "The delivery (cost) record of one message",
    roles=SERVICE,
    query=schemas.FreshQuery,
    errors=(503,),
    description=(
        "state is pending until the views have applied the message: message_id, write_policy, member_count, "
        "conversation_seq and mailbox_entries (the entries it will create) are known at once, the rest is null. "
        "Then state is materialized, once every mailbox entry of the message is durable (materialized_at set); "
        "poll it, or pass the send's position as min_position."
    ),
)
async def get_delivery(request: web.Request, who: Claims, data: schemas.FreshQuery) -> web.Response:
    rt = request.app[RUNTIME]
    cid, seq = request.match_info["cid"], seq_param(request)
    return reply(await blocking(request.app, delivery, rt, who.tenant, cid, seq, min_position(request, data)))


# -- admin role ---------------------------------------------------------------------


@endpoint("Open a review of the mention_only tier", roles=ADMIN, body=schemas.OpenReview, ok=201)
async def open_review(request: web.Request, who: Claims, data: schemas.OpenReview) -> web.Response:
    rt = request.app[RUNTIME]
    result = await blocking(
        request.app, rt.app.open_review, who.tenant, data.size_bucket, data.trigger, data.details, who.sub
    )
    return written(result, status=201)


@endpoint("List the tenant's reviews", roles=ADMIN, query=schemas.FreshQuery, errors=(503,))
async def list_reviews(request: web.Request, who: Claims, data: schemas.FreshQuery) -> web.Response:
    rt = request.app[RUNTIME]
    at = min_position(request, data)
    return reply({"reviews": await blocking(request.app, review_list, rt, who.tenant, at)})


@endpoint("One review", roles=ADMIN)
async def get_review(request: web.Request, who: Claims, data: None) -> web.Response:
    rt = request.app[RUNTIME]
    return reply(await blocking(request.app, review, rt, who.tenant, request.match_info["review_id"]))


@endpoint("Decide a review", roles=ADMIN, body=schemas.DecideReview)
async def decide_review(request: web.Request, who: Claims, data: schemas.DecideReview) -> web.Response:
    rt = request.app[RUNTIME]
    result = await blocking(
        request.app,
        rt.app.decide_review,
        who.tenant,
        request.match_info["review_id"],
        data.decision,
        who.sub,
        read_diffusion_min_saving=data.read_diffusion_min_saving,
        read_diffusion_max_active_ratio=data.read_diffusion_max_active_ratio,
        note=data.note,
    )
    return written(result)


@endpoint("The tenant's tiers (one per size bucket)", roles=ADMIN)
async def list_tiers(request: web.Request, who: Claims, data: None) -> web.Response:
    rt = request.app[RUNTIME]
    return reply({"tiers": await blocking(request.app, rt.app.tiers, who.tenant)})


@endpoint(
    "Roll a tier back: its conversations return to always at once",
    roles=ADMIN,
    body=schemas.RollBackTier,
)
async def roll_back_tier(request: web.Request, who: Claims, data: schemas.RollBackTier) -> web.Response:
    rt = request.app[RUNTIME]
    bucket = request.match_info["size_bucket"]
    if bucket not in {b.value for b in SizeBucket}:
        raise InvalidArgument(f"size_bucket must be one of {[b.value for b in SizeBucket]}", field="size_bucket")
    return written(await blocking(request.app, rt.app.roll_back_tier, who.tenant, bucket, who.sub, data.reason))


@endpoint(
    "Capacity: fan-out entries/s, budget use, T1/T2 state, alpha per size bucket",
    roles=ADMIN,
    query=schemas.FreshQuery,
    errors=(503,),
)
async def get_capacity(request: web.Request, who: Claims, data: schemas.FreshQuery) -> web.Response:
    rt = request.app[RUNTIME]
    at = min_position(request, data)
    return reply(await blocking(request.app, fresh_read, rt, at, capacity, rt, who.tenant))


@endpoint("Each projector's position, the log position, lag and last error", roles=ADMIN)
async def get_projections(request: web.Request, who: Claims, data: None) -> web.Response:
    return reply(await blocking(request.app, projections, request.app[RUNTIME]))


# -- user role ------------------------------------------------------------------------


@endpoint("My session list: the items of SESSION_LIST_BATCH", roles=USER, query=schemas.FreshQuery, errors=(503,))
async def my_sessions(request: web.Request, who: Claims, data: schemas.FreshQuery) -> web.Response:
    rt = request.app[RUNTIME]
    at = min_position(request, data)
    sessions, big = await blocking(request.app, fresh_read, rt, at, rt.queries.session_list, who.tenant, who.sub)
    return reply({"sessions": sessions, "big_group_heads": big})


@endpoint("My mailbox, by cursor (never skips an entry)", roles=USER, query=schemas.MailboxQuery, errors=(503,))
async def my_mailbox(request: web.Request, who: Claims, data: schemas.MailboxQuery) -> web.Response:
    rt = request.app[RUNTIME]
    at = min_position(request, data)
    return reply(
        await blocking(request.app, fresh_read, rt, at, rt.queries.mailbox, who.tenant, who.sub, data.after, data.limit)
    )


USER_COMMAND = (
    " Gated per user (FANOUT_PER_USER_COMMAND_RATE, FANOUT_PER_USER_COMMAND_BURST, shared with REBUILD and the "
    "WebSocket): over it, 429 RATE_LIMITED with Retry-After and details.gate = per_user_command_rate."
)


@endpoint(
    "MARK_READ",
    roles=USER,
    body=schemas.MarkRead,
    errors=(429,),
    description=(
        "A MARK_READ that changes nothing (read_seq not ahead of the current read seq and activity recorded "
        "recently, ADR-0009) writes no event, is not charged to the gate, and answers coalesced: true with the "
        "current read_seq." + USER_COMMAND
    ),
)
async def mark_read(request: web.Request, who: Claims, data: schemas.MarkRead) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    return written(await blocking(request.app, rt.app.mark_read, who.tenant, cid, who.sub, data.read_seq))


@endpoint("PULL_HISTORY: messages after after_seq", roles=USER, query=schemas.HistoryQuery, errors=(503,))
async def my_history(request: web.Request, who: Claims, data: schemas.HistoryQuery) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    at = min_position(request, data)
    return reply(
        await blocking(request.app, fresh_read, rt, at, history, rt, who.tenant, cid, who.sub, data.after_seq, data.limit)
    )


@endpoint(
    "REBUILD my state of a conversation",
    roles=USER,
    errors=(429,),
    description="Returns once rebuilt, with the conversation's fresh sessions[] / big_group_heads[] items." + USER_COMMAND,
)
async def my_rebuild(request: web.Request, who: Claims, data: None) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    return written(await blocking(request.app, rebuild, rt, who.tenant, cid, who.sub))
