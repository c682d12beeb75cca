"""HTTP handlers (SPEC section 6). Each one: check who calls (by `@endpoint`), call the
application or the queries off the event loop, shape the answer. Errors are raised as
domain errors and turned into HTTP in one place (`api/errors.py`).

Why this module is long: one aiohttp handler per route of docs/PROTOCOL.md, each a few lines
that validate (api/schemas.py) and call the runtime; the blocking reads are in api/reads.py, the
sends' thread in api/commands.py."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from aiohttp import web

from api import schemas
from api.endpoint import ADMIN, SERVICE, USER, endpoint
from api.errors import ADMISSION, error_item, json_response
from api.keys import METRICS, RUNTIME, WATCH, blocking, command, commands
from api.metrics import CONTENT_TYPE, Metrics
from api.reads import (
    MIN_POSITION_HEADER,
    POSITION_HEADER,
    alpha,
    capacity,
    delivery,
    fresh_read,
    history,
    preview,
    projections,
    read_through,
    rebuild,
    review,
    review_list,
    scope,
)
from domain.errors import FanoutError, InvalidArgument
from domain.params import SizeBucket
from fanout.overload import storage_unavailable
from fanout.security import Claims
from fanout.strict_json import INT64_MAX

log = logging.getLogger("fanout.api")


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
            f"{MIN_POSITION_HEADER} must be a log position (an integer from 0 to {INT64_MAX})",
            field=MIN_POSITION_HEADER,
        )
    return value if query is None else max(value, query)


# -- operations ------------------------------------------------------------------


@endpoint("Process is up", roles=None)
async def healthz(request: web.Request, who: None, data: None) -> web.Response:
    return reply({"status": "ok"})


@endpoint(
    "Projectors running and every engine reachable (embedded: the event store; distributed: PostgreSQL, "
    "Kafka through the relay's position, Cassandra, and at least one worker alive); 503 otherwise",
    roles=None,
)
async def readyz(request: web.Request, who: None, data: None) -> web.Response:
    rt = request.app[RUNTIME]

    def check() -> dict[str, Any]:
        log_position = rt.log_position()  # touches the event store
        return {"running": rt.running, "last_error": rt.last_error, "log_position": log_position, **rt.check()}

    try:
        state = await blocking(request.app, check)
    except Exception as exc:  # an unreachable engine is "not ready", not an error of this request
        state = {"running": rt.running, "last_error": f"{type(exc).__name__}: {exc}"}
    ready = bool(state["running"]) and state["last_error"] is None and not state.get("errors")
    if "workers" in state and not state["workers"]:
        ready = False  # no projection worker: writes would be accepted and never materialized
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


def message_fields(m: schemas.SendMessage | schemas.BatchedMessage) -> dict[str, Any]:
    """The send's arguments a message body carries (one send or one of a batch)."""
    return {
        "sender": m.sender,
        "text": m.text,
        "mentions": m.mentions,
        "mention_all": m.mention_all,
        "reply_to_seq": m.reply_to_seq,
        "announcement": m.announcement,
        "client_msg_id": m.client_msg_id,
    }


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
    result = await command(request.app, rt.app.send_message, who.tenant, cid, **message_fields(data))
    request.app[METRICS].send_seconds.observe(time.perf_counter() - started)
    duplicate = bool(result.pop("duplicate", False))
    return written(result, status=200 if duplicate else 201)


@endpoint(
    "Send a batch of messages",
    roles=SERVICE,
    body=schemas.SendBatch,
    response=schemas.BatchResult,
    errors=(503,),
    description=(
        "For a service that publishes many messages: up to 100 sends (to any conversations of the tenant) in one "
        "request, one hop to the command thread, one answer. Each message is a send of its own, exactly as "
        "POST /v1/conversations/{cid}/messages would make it, in the order given: one refused (NOT_A_MEMBER, "
        "RATE_LIMITED, ...) writes nothing and does not stop the others; client_msg_id makes each retry "
        "idempotent. The answer is 200 with one result per message, in order: the send result with status 201 "
        "(200: a retry of a client_msg_id already sent), or the error body with the status the send alone would "
        "have had. A body that does not validate is 400 for the whole batch, and the backpressure of ADR-0010 "
        "refuses the whole batch (503): nothing is written then."
    ),
)
async def send_batch(request: web.Request, who: Claims, data: schemas.SendBatch) -> web.Response:
    rt, metrics = request.app[RUNTIME], request.app[METRICS]
    started = time.perf_counter()
    sends = [partial(rt.app.send_message, who.tenant, m.conversation_id, **message_fields(m)) for m in data.messages]
    # one work item of the command lane: the sends join the run's group (ADR-0030), in order
    outcomes = await commands(request.app, sends)
    results, position = batch_results(outcomes, metrics, time.perf_counter() - started)
    if position is None:  # every send refused: the log's position, for read-your-writes all the same
        position = await blocking(request.app, rt.log_position)
    return json_response({"results": results, "position": position}, headers={POSITION_HEADER: str(position)})


def batch_results(
    outcomes: list[tuple[Any, BaseException | None]], metrics: Metrics, took: float
) -> tuple[list[dict[str, Any]], int | None]:
    """Each send's item of a batch's answer (a refusal is its error body), and the highest
    position the sends were written at (None: nothing sent)."""
    results: list[dict[str, Any]] = []
    last: int | None = None
    for i, (result, exc) in enumerate(outcomes):
        if exc is not None:
            refusal = exc if isinstance(exc, FanoutError) else storage_unavailable(exc)  # a full disk: UNAVAILABLE
            if isinstance(refusal, ADMISSION):
                metrics.rejected(refusal)
            if refusal is None:
                log.error("unhandled error on message %d of a batch", i, exc_info=exc)
                refusal = FanoutError("internal error")
            results.append(error_item(refusal))
            continue
        metrics.send_seconds.observe(took)
        duplicate = bool(result.pop("duplicate", False))
        results.append({"status": 200 if duplicate else 201, **result})
        last = max(last or 0, int(result["position"]))
    return results, last


@endpoint("The conversation's head", roles=SERVICE, query=schemas.FreshQuery, errors=(503,))
async def get_conversation(request: web.Request, who: Claims, data: schemas.FreshQuery) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    at = min_position(request, data)
    partition = scope(rt, who.tenant, cid)  # a read of one conversation: its log partition only
    if at is not None:
        return reply(
            await blocking(request.app, fresh_read, rt, at, rt.queries.head, who.tenant, cid, partition=partition)
        )
    return reply(await blocking(request.app, read_through, rt, rt.queries.head, who.tenant, cid, partition=partition))


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
    "The history of the tenant's tiers: each enable (review, parameters), rollback (by, reason), and each "
    "conversation entering or leaving mention_only under a tier, oldest first",
    roles=ADMIN,
)
async def tier_history(request: web.Request, who: Claims, data: None) -> web.Response:
    rt = request.app[RUNTIME]
    return reply({"history": await blocking(request.app, rt.app.history.tier_history, who.tenant)})


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


@endpoint(
    "Preview enable_mention_only for a review: what the decision would switch now (writes nothing)",
    roles=ADMIN,
    query=schemas.PreviewQuery,
    description=(
        "The tier decision's own rule (domain/policy.py decide) applied to every conversation of the review's "
        "scope (tenant x size bucket) as the command side holds it: which would switch to mention_only now, "
        "their N and alpha, the mailbox entries per message and per second it would save, and how many members "
        "would get an estimated unread (the silent ones). The parameters are checked as the decision checks them."
    ),
)
async def preview_review(request: web.Request, who: Claims, data: schemas.PreviewQuery) -> web.Response:
    rt = request.app[RUNTIME]
    rid = request.match_info["review_id"]
    args = (rt, who.tenant, rid, data.read_diffusion_min_saving, data.read_diffusion_max_active_ratio)
    return reply(await blocking(request.app, preview, *args))


@endpoint(
    "Alpha per size bucket and per conversation, with the enter criterion (fanout analyze alpha)",
    roles=ADMIN,
    query=schemas.AlphaQuery,
    description=(
        "The report of `fanout analyze alpha` for the token's tenant (the same code), each conversation with its "
        "write_policy and last switch. Without thresholds, each bucket's tier's (else the latest review decided "
        "with them) judge the criterion."
    ),
)
async def get_alpha(request: web.Request, who: Claims, data: schemas.AlphaQuery) -> web.Response:
    rt = request.app[RUNTIME]
    args = (rt, who.tenant, data.read_diffusion_min_saving, data.read_diffusion_max_active_ratio)
    return reply(await blocking(request.app, alpha, *args))


@endpoint(
    "ADR-0003's re-review conditions: the watched ones red or green with their data, the others as a checklist",
    roles=ADMIN,
    description=(
        "Platform-wide, evaluated once a second by every API process (ADR-0026): (1) T1 or T2 firing without a "
        "break for FANOUT_REREVIEW_HOLD (7d); (4) the mailbox layer's unit cost (microseconds of the mailbox "
        "store's write per entry) above 3 x FANOUT_MAILBOX_UNIT_COST_ESTIMATE_US; (7) the large bucket's mean "
        "alpha above FANOUT_REREVIEW_ALPHA_MAX (0.5). One that turns red opens one review per episode."
    ),
)
async def get_rereview(request: web.Request, who: Claims, data: None) -> web.Response:
    return reply(await blocking(request.app, request.app[WATCH].snapshot))


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
    args = (history, rt, who.tenant, cid, who.sub, data.after_seq, data.limit)
    return reply(await blocking(request.app, fresh_read, rt, at, *args, partition=scope(rt, who.tenant, cid)))


@endpoint(
    "REBUILD my state of a conversation",
    roles=USER,
    errors=(429,),
    description="Returns once rebuilt, with the conversation's fresh sessions[] / big_group_heads[] items."
    + USER_COMMAND,
)
async def my_rebuild(request: web.Request, who: Claims, data: None) -> web.Response:
    rt = request.app[RUNTIME]
    cid = request.match_info["cid"]
    return written(await blocking(request.app, rebuild, rt, who.tenant, cid, who.sub))
