"""The command side: an eventsourcing Application. Thin: load, call the domain, save.

Commands are serialized by one lock per process; aggregates stay in the repository
cache without deep copies, and any failure evicts what it touched, so a half-applied
command can never leak into the next one.

One writer per event store (the embedded runtime) trusts its cache. Several writers on
one store (`shared_store=True`: API replicas on PostgreSQL) retry a command whose save
lost an optimistic-concurrency race (another replica appended to the same stream first):
the command runs again on the fresh aggregate, so the admission gates it checks stay
exact across replicas. What they read (ADR-0023):

* an aggregate the command is about to save is taken from the cache as it is, with no
  fast-forward query: if another replica appended to it meanwhile, the save of the
  decision made on it is refused by the (originator_id, version) key and the command is
  retried on the fresh aggregate. A decision that saves nothing (a refusal, a no-op, a
  duplicate) has no such check, so a command that ends without saving every aggregate it
  took unchecked is decided again on fresh ones (`StaleDecision`);
* an aggregate read for validation only (the conversation a MARK_READ checks, a tier, a
  review's existence...) is fast-forwarded from the store on every load, as before;
* an absent tier is remembered for at most `NO_TIER_TTL` seconds, and only trusted for a
  conversation in `always` (see `_evaluate`);
* the tenant's fan-out bucket is K `TenantQuotaSlot` streams instead of one `TenantQuota`
  stream: a replica charges its own slot, and borrows from the others (read fresh) only
  when its own cannot pay, so replicas of one tenant do not race on one stream
  (fanout/quota_slots.py).

MARK_READ appends to the member's own MemberReadState stream, not to the conversation's
(ADR-0018); the activity refreshes it pends are group-committed by `fanout/activity.py`.

Why this module is long: every command of the service (conversations, sends, MARK_READ, REBUILD,
reviews, tiers) runs in one eventsourcing Application: they share its lock, its unit of work,
its caches and the retry on a lost race. The pieces with a job of their own left:
fanout/units.py, fanout/activity.py, fanout/wire.py, fanout/history.py, fanout/quota_slots.py."""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import RecordConflictError, Recording

from domain.conversation import Conversation, check_id
from domain.errors import AlreadyExists, FanoutError, InvalidArgument, NotFound, Unavailable
from domain.identity import check_tenant
from domain.params import Parameters, SizeBucket, WritePolicy
from domain.policy import DISABLED, TierTerms
from domain.quota import QUOTA_SLOTS, SlottedQuota, TenantQuota, TenantQuotaSlot
from domain.reads import MemberReadState
from domain.review import Review
from domain.tier import Tier
from fanout.activity import PendingActivity
from fanout.gate import UserCommandGate
from fanout.history import History
from fanout.overload import storage_unavailable
from fanout.quota_slots import QuotaSlots
from fanout.units import Group, GroupBroken, Outcome, Staged, Unit, outcome, project
from fanout.wire import review_dict, tier_dict

A = TypeVar("A", bound=Aggregate)
F = TypeVar("F", bound=Callable[..., Any])

CONFLICT_RETRIES = 30  # a command that lost this many races in a row is refused (503); 10 refused a few
# sends of four replicas of one tenant borrowing from each other's quota slots right after a restart
# (tests/distributed/test_quota_slots.py failed 2 runs of 3 at 10, at the session's start and after)
# How long a replica on a shared store trusts that a scope has no tier (ADR-0023).
NO_TIER_TTL = 1.0
# Pending activity refreshes of MARK_READ are appended at most this often per conversation
# (ADR-0018, fanout/activity.py): a crash loses at most this much of them.
ACTIVITY_FLUSH_INTERVAL = 0.2

log = logging.getLogger(__name__)


class StaleDecision(Exception):  # noqa: N818 (control flow inside the application, never raised out of it)
    """A command ended without saving an aggregate it took from the cache unchecked (no
    fast-forward): its outcome (a refusal, a no-op, a duplicate's answer) may rest on a
    stale copy, and no version check will catch it. `retried` runs it again on fresh
    aggregates; `error` is what it raised (None when it returned)."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__("decided on an unchecked cached aggregate; deciding again on fresh ones")
        self.error = error


def retried(method: F) -> F:
    """Run a command again when its save lost an optimistic-concurrency race. `_unit`
    has evicted what the attempt touched, so the next attempt loads the aggregates as
    the winner left them and decides again (a gate that now refuses, refuses). A
    `StaleDecision` runs it again too, every load fast-forwarded this time."""

    @functools.wraps(method)
    def run(self: FanoutApplication, *args: Any, **kwargs: Any) -> Any:
        local = self._local
        outer = getattr(local, "fresh", False)
        try:
            for attempt in range(CONFLICT_RETRIES):
                try:
                    return method(self, *args, **kwargs)
                except RecordConflictError:
                    self.conflicts += 1
                    time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # noqa: S311 (jitter, not crypto)
                except StaleDecision:
                    self.stale_decisions += 1
                    local.fresh = True
                    try:
                        return method(self, *args, **kwargs)
                    except RecordConflictError:
                        self.conflicts += 1  # and the loop goes on, fresh
        finally:
            local.fresh = outer
        raise Unavailable(
            f"not written: {CONFLICT_RETRIES} concurrent writers won the race for the same conversation; retry",
            reason="write_conflict",
            retry_after_ms=100,
        )

    return run  # type: ignore[return-value]


class FanoutApplication(Application[UUID]):
    name = "fanout"
    snapshotting_intervals = {
        Conversation: 200,
        TenantQuota: 2000,
        TenantQuotaSlot: 2000,
        Tier: 200,
        MemberReadState: 100,
    }
    # One writer per event store (the data-dir lock), so a cached aggregate is never
    # behind the store: no deep copy, and no fast-forward query per command.
    env = {
        "AGGREGATE_CACHE_MAXSIZE": "10000",
        "DEEPCOPY_FROM_AGGREGATE_CACHE": "n",
        "AGGREGATE_CACHE_FASTFORWARD": "n",
    }

    def __init__(
        self,
        params: Parameters,
        env: dict[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        message_sender: Callable[[str, str, int], str | None] | None = None,
        conversations_in_scope: Callable[[str, str], list[str]] | None = None,
        read_state: Callable[[str, str, str], tuple[int, int] | None] | None = None,
        shared_store: bool = False,
        quota_slots: int | None = None,
        replica_id: str | None = None,
        activity_flush_interval: float = ACTIVITY_FLUSH_INTERVAL,
        legacy_read_marks: bool = False,
    ) -> None:
        self.shared_store = shared_store
        if shared_store:  # other writers append to the same streams: never trust the cache blindly
            env = {**(env or {}), "AGGREGATE_CACHE_FASTFORWARD": "y"}
        super().__init__(env)
        self.conflicts = 0  # saves that lost a race and were retried
        # The tenant bucket (ADR-0023): one TenantQuota stream per tenant for one writer (0);
        # K TenantQuotaSlot streams for replicas of a shared store, this one charging its own.
        slots = (QUOTA_SLOTS if shared_store else 0) if quota_slots is None else quota_slots
        self.quotas = QuotaSlots(self._find, slots, replica_id or uuid.uuid4().hex)
        self.params = params
        self.clock = clock
        self.message_sender = message_sender or (lambda tenant, cid, seq: None)
        self.conversations_in_scope = conversations_in_scope or (lambda tenant, bucket: [])
        # (read_seq, views position) of a member as the views show it, for coalescing MARK_READ
        self.read_state = read_state or (lambda tenant, cid, user: None)
        self.user_gate = UserCommandGate(params)
        self.lock = threading.RLock()
        self.saved_listeners: list[Callable[[], None]] = []
        # called in the writer's lock after each save with (position, mailbox entries) per event
        self.recorded_listeners: list[Callable[[list[tuple[int, int]]], None]] = []
        self._loaded: list[Aggregate] = []
        self._unit_now: Unit | None = None
        self._group: Group | None = None  # the commands being grouped (on its owner thread)
        self.group_commits = 0  # transactions of grouped commands
        self.grouped_commands = 0  # commands written in them
        self.group_fallbacks = 0  # groups whose one transaction failed: their commands ran again alone
        self._local = threading.local()  # .fresh: this thread's command re-decides on fresh aggregates
        self.stale_decisions = 0  # commands decided again because an unchecked aggregate was not saved
        # (tenant, size bucket) -> until when (monotonic) it is known to have no tier
        self._no_tier: dict[tuple[str, str], float] = {}
        # ADR-0018. 0 records a stale member's activity in the read's own unit (one
        # conversation append per such read); legacy_read_marks writes Conversation.ReadMarked
        # per read as before ADR-0018 (kept for bench/mark_read_scale.py only).
        self.activity_flush_interval = activity_flush_interval
        self.legacy_read_marks = legacy_read_marks
        self.activity = PendingActivity(self.lock, activity_flush_interval, self._flush_conversation)
        self.activity_events = 0  # MembersActive events saved
        self.history = History(self.recorder, self.mapper)  # the event store's answers no view keeps

    # -- plumbing ------------------------------------------------------------

    def save(self, *objs: Any, **kwargs: Any) -> list[Recording[UUID]]:
        """Application.save, its events collected by `Staged` (no Protocol isinstance checks)."""
        processing_event = Staged()
        processing_event.collect_events(*objs, **kwargs)
        recordings = self._record(processing_event)
        self._take_snapshots(processing_event)
        self._notify(recordings)
        self.notify(processing_event.events)  # the library's deprecated hook, called as it does
        return recordings

    def _take_snapshots(self, processing_event: ProcessingEvent[UUID]) -> None:
        """A snapshot of each aggregate whose saved events reached a multiple of its interval,
        taken from the aggregate just saved: it is the recorded state at its version (the save
        succeeded at that version). The library reads the aggregate back from the store and
        replays up to 2,000 events (a quota slot's interval) on the command thread instead;
        that way stays for a group a refused command may have changed (`Staged.tainted`)."""
        if not (self.snapshots and self.snapshotting_intervals):
            return
        if getattr(processing_event, "tainted", True):
            super()._take_snapshots(processing_event)
            return
        due: dict[UUID, Aggregate] = {}
        for event in processing_event.events:
            aggregate = processing_event.aggregates.get(event.originator_id)
            interval = self.snapshotting_intervals.get(type(aggregate)) if aggregate is not None else None
            if interval is not None and event.originator_version % interval == 0:
                due[event.originator_id] = aggregate  # type: ignore[assignment]
        snapshots = []
        for aggregate in due.values():
            snapshot_class = getattr(type(aggregate), "Snapshot", type(self).snapshot_class)
            assert snapshot_class is not None, f"{type(aggregate)} has no snapshot class"
            snapshots.append(snapshot_class.take(aggregate))
        if snapshots:
            self.snapshots.put(snapshots)

    def _find(
        self,
        cls: type[A],
        aggregate_id: UUID,
        tenant: str,
        what: str,
        *,
        saves: bool = False,
        monotone: bool = False,
        **details: Any,
    ) -> A | None:
        """The caller's aggregate of this id, or None when there is none. An aggregate of
        another kind or of another tenant under this id is NotFound: never acted on
        (ADR-0008; the derivation makes this unreachable, the check makes it certain).

        `saves`: the command is about to save this aggregate. On a shared store a cached
        copy is then taken as it is, without the fast-forward query (ADR-0023): a stale
        copy's save is refused by the version key; what the command decides without
        saving it is decided again (`StaleDecision`, raised by `_unit`), unless it is
        `monotone`: a token bucket, whose stale copy holds at least the fresh one's tokens,
        so that a refusal made on it is right and an admission is checked by its save."""
        check_tenant(tenant)
        found: Aggregate | None = None
        unit = self._unit_now
        fresh = getattr(self._local, "fresh", False)
        group = self._grouping()
        if group is not None and not fresh and aggregate_id not in group.evicted:
            # staged by an earlier command of the group: newer than the store (ADR-0030)
            found = group.processing.aggregates.get(aggregate_id)  # type: ignore[assignment]
            if found is not None and self.shared_store and unit is not None and not monotone:
                unit.unchecked.append(found)
        if found is None and saves and self.shared_store and unit is not None and not fresh:
            cache = self.repository.cache
            if cache is not None:
                with suppress(KeyError):
                    cached: Any = cache.get(aggregate_id)
                    if isinstance(cached, Aggregate):
                        found = cached
                        if not monotone:
                            unit.unchecked.append(cached)
        if found is None:
            try:
                found = self.repository.get(aggregate_id, projector_func=project)
            except AggregateNotFoundError:
                return None
        if not isinstance(found, cls) or getattr(found, "tenant", None) != tenant:
            raise NotFound(f"{what} not found", **details)
        self._loaded.append(found)
        return found

    def _conversation(self, tenant: str, conversation_id: str, *, saves: bool = False) -> Conversation:
        what = f"conversation {conversation_id}"
        conv = self._find(
            Conversation,
            Conversation.create_id(tenant, conversation_id),
            tenant,
            what,
            saves=saves,
            conversation_id=conversation_id,
        )
        if conv is None or conv.conversation_id != conversation_id:
            raise NotFound(f"{what} not found", conversation_id=conversation_id)
        return conv

    @contextmanager
    def _unit(self) -> Iterator[Unit]:
        """Collect aggregates to save atomically. On failure, evict from the cache every
        aggregate the command mutated, so the next command reloads it from the store."""
        touched = Unit()
        with self.lock:
            self._loaded = []
            self._unit_now = touched
            try:
                try:
                    yield touched
                except FanoutError as refused:  # decided on an unchecked copy: decide again, fresh
                    if touched.unchecked:
                        raise StaleDecision(refused) from refused
                    raise
                if any(not any(a is t for t in touched) for a in touched.unchecked):
                    raise StaleDecision(None)
                group = self._grouping()
                if group is not None:  # written with the group's other commands (ADR-0030)
                    group.stage(touched)
                    return
                if touched:
                    recordings = self.save(*touched)
                    if recordings:
                        touched.position = max(r.notification.id for r in recordings)
                self._saved(touched)
            except BaseException as exc:
                if isinstance(exc, RecordConflictError):
                    self.quotas.lost_race(touched)
                dropped = [a for a in [*touched, *self._loaded] if a in touched or getattr(a, "_pending_events", None)]
                group = self._grouping()
                if group is not None and any(a.id in group.processing.aggregates for a in dropped):
                    # This command changed an aggregate earlier commands of the group staged, and
                    # failed: write theirs now, so that the next commands load them as written.
                    group.processing.tainted = True
                    try:
                        self._commit(group)
                    except BaseException as failed:
                        self._abandon(group, failed)
                        raise GroupBroken() from failed
                    group.reset()
                for a in dropped:
                    self._evict(a.id)
                unavailable = None if isinstance(exc, FanoutError | StaleDecision) else storage_unavailable(exc)
                if unavailable is not None:  # a full disk: 503 UNAVAILABLE, nothing written
                    raise unavailable from exc
                raise
            finally:
                self._unit_now = None
        if touched:
            for listener in self.saved_listeners:
                listener()

    def _saved(self, unit: Unit) -> None:
        for key, applied, recorded in unit.activity:
            self.activity.saved(key, applied)
            self.activity_events += recorded

    # -- group commit of queued commands (ADR-0030) ---------------------------------------

    def _grouping(self) -> Group | None:
        g = self._group
        return g if g is not None and g.owner == threading.get_ident() else None

    def grouped(self, calls: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """Run commands of this application (`partial(app.send_message, ...)`) in order, as if
        one after another, with their events written in ONE event-store transaction: each
        returns or raises as it would alone; a refused one writes nothing and the others go
        on. A refused command that had changed an aggregate staged by earlier ones has those
        written first (two transactions). If a transaction fails (another writer won a race
        on one of its aggregates, or the store refused it), nothing of it is written and its
        commands and every later one run again alone, in order. Returns (result, None) or
        (None, exception) per call."""
        if len(calls) < 2 or self._grouping() is not None:
            return [outcome(c) for c in calls]
        outcomes: list[Outcome] = []
        with self.lock:
            group = self._group = Group()
            written = 0  # calls[:written] are written (or wrote nothing)
            try:
                for c in calls:
                    done = outcome(c)
                    if isinstance(done[1], GroupBroken):
                        break
                    outcomes.append(done)
                    if not group.units:  # a piece was written within this call
                        written = len(outcomes)
                else:
                    try:
                        self._commit(group)
                    except BaseException as exc:
                        self._abandon(group, exc)
                    else:
                        return outcomes
            finally:
                self._group = None
        self.group_fallbacks += 1
        return outcomes[:written] + [outcome(c) for c in calls[written:]]  # alone, in order

    def _commit(self, group: Group) -> None:
        """The group's one transaction, then what each command's own save would have done."""
        pe = group.processing
        top: int | None = None
        if pe.events:
            recordings = self._record(pe)
            self.group_commits += 1
            self.grouped_commands += len(group.units)
            self._take_snapshots(pe)
            self._notify(recordings)
            at = {id(r.domain_event): r.notification.id for r in recordings}
            for unit, first, end in group.units:
                if end > first:
                    unit.position = max(at[id(e)] for e in pe.events[first:end])
            top = max(at.values())
        for unit, _, _ in group.units:
            self._saved(unit)
        for aggregate_id in group.evicted:  # the commit may have cached it as a refused command left it
            self._evict(aggregate_id)
        if group.answers:
            top = top if top is not None else self.log_position()
            for result, unit in group.answers:
                result["position"] = unit.position if unit.position is not None else top
        if pe.events:
            for listener in self.saved_listeners:
                listener()

    def _abandon(self, group: Group, exc: BaseException) -> None:
        """The group's transaction failed: drop every aggregate it touched from the cache."""
        if isinstance(exc, RecordConflictError):
            self.quotas.lost_race(group.processing.aggregates.values())
        for aggregate_id in {*group.processing.aggregates, *group.evicted}:
            self._evict(aggregate_id)
        log.debug("a group of %d commands was not written (%s); running them alone", len(group.units), exc)

    def _notify(self, recordings: list[Recording[UUID]]) -> None:
        """eventsourcing's hook after a save: report positions and each send's fan-out
        entries (backpressure counts the read side's backlog without a query, ADR-0010)."""
        if self.recorded_listeners:
            recorded = [(r.notification.id, int(getattr(r.domain_event, "fanout_entries", 0) or 0)) for r in recordings]
            for listener in self.recorded_listeners:
                listener(recorded)

    def log_position(self) -> int:
        """The notification id of the last event in the store (0 when empty)."""
        return self.recorder.max_notification_id() or 0

    def _positioned(self, result: dict[str, Any], unit: Unit) -> dict[str, Any]:
        """A command's answer with its log position (read-your-writes): the last event it
        recorded, or the current log position when it recorded nothing (in a group: once the
        group is written)."""
        group = self._grouping()
        if group is not None:
            group.answers.append((result, unit))
            return result
        result["position"] = unit.position if unit.position is not None else self.log_position()
        return result

    def _evict(self, aggregate_id: UUID) -> None:
        group = self._grouping()
        if group is not None:
            group.evicted.add(aggregate_id)
        cache = getattr(self.repository, "cache", None)
        if cache is not None:
            with suppress(KeyError):
                cache.get(aggregate_id, evict=True)

    # -- activity of reads, group-committed (ADR-0018) ---------------------------

    def _apply_activity(self, conv: Conversation, touched: Unit) -> None:
        """Record this process's pending activity refreshes of this conversation in the
        command's unit (before anything else it raises on the conversation), so sends and
        policy evaluations decide with them, at no extra append."""
        key = (conv.tenant, conv.conversation_id)
        pending = self.activity.of(key)
        if not pending:
            return
        applied = dict(pending)
        recorded = bool(conv.record_activity(applied, self.clock()))
        touched.activity.append((key, applied, recorded))
        if recorded:
            touched.touch(conv)

    def pending_activity(self) -> int:
        """Members whose activity refresh is not appended yet."""
        return self.activity.count()

    def flush_activity(self) -> int:
        """Append every pending activity refresh now (fanout/activity.py); the events appended."""
        return self.activity.flush()

    @retried
    def _flush_conversation(self, tenant: str, conversation_id: str) -> int:
        with self._unit() as touched:
            conv = self._conversation(tenant, conversation_id)
            self._apply_activity(conv, touched)
        return 1 if touched else 0

    def close(self) -> None:
        """Append the pending activity refreshes, then close the store."""
        self.activity.close()
        try:
            self.activity.flush()
        finally:
            super().close()

    def _tier(self, tenant: str, size_bucket: str, *, absent_may_be_stale: bool = False) -> Tier | None:
        """The scope's tier, or None. Most scopes never get a tier: that is remembered
        instead of a store query per send. One writer (the embedded runtime) remembers
        it for good (only it can create one). On a shared store another replica may
        create it: the absence is remembered for NO_TIER_TTL seconds and trusted only
        when the caller says a stale absence is harmless (`absent_may_be_stale`)."""
        key = (tenant, size_bucket)
        until = self._no_tier.get(key)
        if until is not None and (not self.shared_store or (absent_may_be_stale and time.monotonic() < until)):
            return None
        tier = self._find(
            Tier, Tier.create_id(tenant, size_bucket), tenant, f"tier {size_bucket}", size_bucket=size_bucket
        )
        if tier is not None and tier.size_bucket != size_bucket:
            raise NotFound(f"tier {size_bucket} not found", size_bucket=size_bucket)
        if tier is None:
            self._no_tier[key] = time.monotonic() + NO_TIER_TTL if self.shared_store else float("inf")
        else:
            self._no_tier.pop(key, None)
        return tier

    def _evaluate(self, conv: Conversation, now: float, touched: list[Aggregate]) -> None:
        """Run the write-policy state machine and keep the tier's roster in step."""
        scope = conv.policy_scope or conv.size_bucket(self.params).value
        # A stale "no tier" is harmless only for a conversation in always: it then stays in
        # always (evaluate_write_policy decides nothing without an enabled tier), i.e. every
        # member still gets an entry, and the replica that enabled the tier evaluates the
        # scope's conversations itself. For one in mention_only a missing tier would mean a
        # rollback (a switch to always, the tier's roster not updated): look it up.
        tier = self._tier(conv.tenant, scope, absent_may_be_stale=conv.policy is WritePolicy.ALWAYS)
        terms = tier.terms() if tier is not None else DISABLED
        switch = conv.evaluate_write_policy(terms, now, self.params)
        if switch is None or tier is None:
            return
        if switch.to is WritePolicy.MENTION_ONLY:
            tier.conversation_entered(conversation_id=conv.conversation_id)
        else:
            tier.conversation_exited(conversation_id=conv.conversation_id)
        if tier not in touched:
            touched.append(tier)

    # -- conversations -----------------------------------------------------

    @retried
    def create_conversation(
        self, tenant: str, conversation_id: str | None, title: str, members: Sequence[str]
    ) -> dict[str, Any]:
        cid = (
            check_id(conversation_id, "conversation_id")
            if conversation_id is not None
            else f"c_{uuid.uuid4().hex[:16]}"
        )
        if not isinstance(title, str) or len(title) > 256:
            raise InvalidArgument("title must be a string of at most 256 characters", field="title")
        with self._unit() as touched:
            if self._find(Conversation, Conversation.create_id(tenant, cid), tenant, f"conversation {cid}") is not None:
                raise AlreadyExists(f"conversation {cid} already exists", conversation_id=cid)
            now = self.clock()
            conv = Conversation(tenant=tenant, conversation_id=cid, title=title, at=now)
            touched.append(conv)
            if members:
                self._check_bulk(members)
                conv.join(members, now, self.params)
            result = {"conversation_id": cid, "title": title, "member_count": len(conv.members)}
        return self._positioned(result, touched)

    def _check_bulk(self, user_ids: Sequence[str]) -> None:
        if not isinstance(user_ids, list | tuple) or len(user_ids) > self.params.max_bulk_members:
            raise InvalidArgument(
                f"user_ids must be a list of at most {self.params.max_bulk_members} ids", field="user_ids"
            )

    @retried
    def add_members(self, tenant: str, conversation_id: str, user_ids: Sequence[str]) -> dict[str, Any]:
        self._check_bulk(user_ids)
        with self._unit() as touched:
            conv = self._conversation(tenant, conversation_id, saves=True)
            self._apply_activity(conv, touched)
            now = self.clock()
            added = conv.join(user_ids, now, self.params)
            if added:
                touched.touch(conv)
                self._evaluate(conv, now, touched)
            result = {"added": len(added), "member_count": len(conv.members)}
        return self._positioned(result, touched)

    @retried
    def remove_member(self, tenant: str, conversation_id: str, user_id: str) -> dict[str, Any]:
        with self._unit() as touched:
            conv = self._conversation(tenant, conversation_id, saves=True)
            self._apply_activity(conv, touched)
            now = self.clock()
            conv.leave(user_id, now)
            touched.touch(conv)
            self._evaluate(conv, now, touched)
            result = {"member_count": len(conv.members)}
        return self._positioned(result, touched)

    @retried
    def send_message(
        self,
        tenant: str,
        conversation_id: str,
        *,
        sender: str,
        text: str,
        mentions: Sequence[str] = (),
        mention_all: bool = False,
        reply_to_seq: int | None = None,
        announcement: bool = False,
        client_msg_id: str | None = None,
    ) -> dict[str, Any]:
        reply_to_user = None
        if isinstance(reply_to_seq, int) and not isinstance(reply_to_seq, bool) and reply_to_seq >= 1:
            # Resolved once, then carried by the event (deterministic replays). Anything else
            # is left to Conversation.send, which refuses it with INVALID_ARGUMENT.
            reply_to_user = self.message_sender(tenant, conversation_id, reply_to_seq)
        with self._unit() as touched:
            conv = self._conversation(tenant, conversation_id, saves=True)
            previous = conv.previous_send(client_msg_id)
            if previous is not None:
                seq, message_id, policy = previous
                result = {"conversation_seq": seq, "message_id": message_id, "write_policy": policy, "duplicate": True}
                return self._positioned(result, touched)  # the current log position: it holds the original
            self._apply_activity(conv, touched)
            now = self.clock()
            self._evaluate(conv, now, touched)
            quota = self.quotas.quota(tenant)
            message_id = f"m_{uuid.uuid4().hex}"
            seq = conv.send(
                sender=sender,
                text=text,
                message_id=message_id,
                quota=quota,
                params=self.params,
                now=now,
                mentions=mentions,
                mention_all=mention_all,
                reply_to_seq=reply_to_seq,
                reply_to_user=reply_to_user,
                announcement=announcement,
                client_msg_id=client_msg_id,
            )
            touched.touch(conv)
            if isinstance(quota, SlottedQuota):
                for slot in quota.charged:
                    touched.touch(slot)
            elif isinstance(quota, TenantQuota):
                touched.touch(quota)
            result = {"conversation_seq": seq, "message_id": message_id, "write_policy": conv.write_policy}
        return self._positioned(result, touched)

    # -- user commands (gated per user, ADR-0009) ------------------------------

    @retried
    def mark_read(self, tenant: str, conversation_id: str, user_id: str, read_seq: int) -> dict[str, Any]:
        """MARK_READ. One that changes nothing (read seq not ahead of the views' and
        activity recorded recently) writes no event, is not charged to the user's gate,
        and answers `coalesced: true` with the current read seq and the views' position.

        Otherwise the read seq is appended to the member's MemberReadState stream only
        (ADR-0018): the conversation is read (validation, activity), not written, unless
        the member's recorded activity is stale; that refresh is group-committed (see
        fanout/activity.py)."""
        known = self.read_state(tenant, conversation_id, user_id)  # a view read, off the command lock
        key = (tenant, conversation_id)
        stale = False
        with self._unit() as touched:
            conv = self._conversation(tenant, conversation_id)
            now = self.clock()
            pending = self.activity.at(key, user_id) if user_id in conv.members else 0.0
            if known is not None and conv.read_changes_nothing(user_id, read_seq, known[0], now, self.params, pending):
                return {
                    "conversation_id": conversation_id,
                    "read_seq": known[0],
                    "coalesced": True,
                    "position": known[1],
                }
            conv.check_read(user_id, read_seq)
            # Gate before the event: a refused command must not leave a pending event behind
            # (that would evict, then reload, a possibly 100k-member aggregate per refusal).
            self.user_gate.admit(tenant, user_id, now)
            if self.legacy_read_marks:
                conv.mark_read(user_id, read_seq, now)
                touched.append(conv)
            else:
                mark = self._find(
                    MemberReadState,
                    MemberReadState.create_id(tenant, conversation_id, user_id),
                    tenant,
                    "read state",
                    saves=True,
                )
                if mark is None:
                    mark = MemberReadState(
                        tenant=tenant, conversation_id=conversation_id, user_id=user_id, read_seq=read_seq, at=now
                    )
                    touched.append(mark)
                elif mark.conversation_id != conversation_id or mark.user_id != user_id:
                    raise NotFound("read state not found")  # unreachable: the id is derived from them
                elif mark.mark(read_seq, now):
                    touched.append(mark)
                stale = not conv.activity_is_recent(user_id, now, self.params, pending)
                if stale and self.activity_flush_interval <= 0:
                    self.activity.add(key, user_id, now)
                    self._apply_activity(conv, touched)
                    stale = False
            result = {"conversation_id": conversation_id, "read_seq": read_seq, "coalesced": False}
        if stale:  # recorded after the read's own save: a lost race re-decides it
            self.activity.defer(key, user_id, now)
        return self._positioned(result, touched)

    @retried
    def request_rebuild(self, tenant: str, conversation_id: str, user_id: str) -> dict[str, Any]:
        with self._unit() as touched:
            conv = self._conversation(tenant, conversation_id, saves=True)
            now = self.clock()
            if user_id in conv.members:  # a non-member gets NOT_A_MEMBER below, uncharged
                self.user_gate.admit(tenant, user_id, now)
            self._apply_activity(conv, touched)
            conv.request_rebuild(user_id, now)
            touched.touch(conv)
            result = {"conversation_id": conversation_id, "rebuilt_at_seq": conv.seq}
        return self._positioned(result, touched)

    def evaluate_conversation(self, tenant: str, conversation_id: str) -> str:
        """An alpha update: re-run the state machine with the current clock."""
        return self._evaluate_conversation(tenant, conversation_id)[0]

    @retried
    def _evaluate_conversation(self, tenant: str, conversation_id: str) -> tuple[str, int | None]:
        with self._unit() as touched:
            conv = self._conversation(tenant, conversation_id)
            before = conv.version
            self._apply_activity(conv, touched)
            self._evaluate(conv, self.clock(), touched)
            if conv.version != before:
                touched.touch(conv)
            policy = conv.write_policy
        return policy, touched.position

    def conversation(self, tenant: str, conversation_id: str) -> Conversation:
        with self.lock:
            return self._conversation(tenant, conversation_id)

    # -- reviews and tiers -------------------------------------------------

    @retried
    def open_review(
        self,
        tenant: str,
        size_bucket: str,
        trigger: str,
        details: dict[str, Any],
        opened_by: str,
        review_key: str | None = None,
    ) -> dict[str, Any]:
        _bucket(size_bucket)
        with self._unit() as touched:
            if review_key is not None:
                existing = self._find(Review, Review.create_id(review_key=review_key), tenant, "review")
                if existing is not None:
                    return self._positioned(review_dict(existing), touched)
            review = Review(
                tenant=tenant,
                size_bucket=size_bucket,
                trigger=trigger,
                details=details,
                opened_by=opened_by,
                at=self.clock(),
                review_key=review_key,
            )
            touched.append(review)
            result = review_dict(review)
        return self._positioned(result, touched)

    def review(self, tenant: str, review_id: str) -> Review:
        with self.lock:
            return self._review(tenant, review_id)

    def _review(self, tenant: str, review_id: str, *, saves: bool = False) -> Review:
        try:
            rid = UUID(review_id)
        except (ValueError, TypeError, AttributeError):
            raise NotFound(f"review {review_id} not found", review_id=review_id) from None
        review = self._find(Review, rid, tenant, f"review {review_id}", saves=saves, review_id=review_id)
        if review is None:
            raise NotFound(f"review {review_id} not found", review_id=review_id)
        return review

    @retried
    def decide_review(
        self,
        tenant: str,
        review_id: str,
        decision: str,
        decided_by: str,
        read_diffusion_min_saving: float | None = None,
        read_diffusion_max_active_ratio: float | None = None,
        note: str = "",
    ) -> dict[str, Any]:
        with self._unit() as touched:
            review = self._review(tenant, review_id, saves=True)
            now = self.clock()
            review.decide(
                decision,
                decided_by,
                now,
                read_diffusion_min_saving=read_diffusion_min_saving,
                read_diffusion_max_active_ratio=read_diffusion_max_active_ratio,
                note=note,
            )
            touched.append(review)
            if decision == "enable_mention_only":
                tier = self._tier(tenant, review.size_bucket) or Tier(tenant=tenant, size_bucket=review.size_bucket)
                self._no_tier.pop((tenant, review.size_bucket), None)
                tier.enable(review, now)
                touched.append(tier)
            result = review_dict(review)
        position = touched.position
        if decision == "enable_mention_only":
            # A tier change is an evaluation point for the conversations of its scope.
            for cid in self.conversations_in_scope(tenant, review.size_bucket):
                switched_at = self._evaluate_conversation(tenant, cid)[1]
                if switched_at is not None:
                    position = switched_at
        result["position"] = position if position is not None else self.log_position()
        return result

    @retried
    def roll_back_tier(self, tenant: str, size_bucket: str, by: str, reason: str) -> dict[str, Any]:
        """The safety valve: every conversation of the scope returns to always at once."""
        _bucket(size_bucket)
        with self._unit() as touched:
            tier = self._tier(tenant, size_bucket)
            if tier is None:
                raise NotFound(f"tier {size_bucket} of tenant {tenant} was never enabled", size_bucket=size_bucket)
            now = self.clock()
            cids = tier.roll_back(by, reason, now)
            touched.append(tier)
            for cid in cids:
                conv = self._conversation(tenant, cid)
                self._apply_activity(conv, touched)
                if conv.evaluate_write_policy(DISABLED, now, self.params) is not None:
                    touched.touch(conv)
                tier.conversation_exited(conversation_id=cid)  # the roster empties either way
            result = {**tier_dict(tenant, size_bucket, tier), "returned_to_always": cids}
        return self._positioned(result, touched)

    def tiers(self, tenant: str) -> list[dict[str, Any]]:
        with self.lock:
            return [tier_dict(tenant, b.value, self._tier(tenant, b.value)) for b in SizeBucket]

    def tier_terms(self, tenant: str, size_bucket: str) -> TierTerms:
        with self.lock:
            tier = self._tier(tenant, size_bucket)
            return tier.terms() if tier is not None else DISABLED


def _bucket(size_bucket: str) -> SizeBucket:
    try:
        return SizeBucket(size_bucket)
    except ValueError:
        raise InvalidArgument(
            f"size_bucket must be one of {[b.value for b in SizeBucket]}", field="size_bucket"
        ) from None
