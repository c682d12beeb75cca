"""The commands of the service, as cosmicpython's handlers read: load the aggregates, call the
domain, save. `FanoutApplication` is the eventsourcing Application every runtime runs:

* fanout/command_unit.py `CommandUnit`: how a command runs (one at a time, its aggregates
  loaded by `_find` under the shared-store cache rules of ADR-0023, saved atomically by
  `_unit`, run again after a lost race, grouped in one transaction with queued ones);
* fanout/tiers.py `TierCommands`: the reviews and the tiers they enable;
* this module: the commands on conversations (create, join, leave, send, the write-policy
  evaluation) and the users' commands (MARK_READ, REBUILD), with the tenant's fan-out
  bucket (fanout/quota_slots.py) and MARK_READ's activity refreshes (fanout/activity.py);
* fanout/history.py: what the commands' event store answers that no view keeps (`history`).

MARK_READ appends to the member's own MemberReadState stream, not to the conversation's
(ADR-0018); the activity refreshes it pends are group-committed by `fanout/activity.py`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from eventsourcing.domain import Aggregate

from domain.conversation import Conversation, check_id
from domain.errors import AlreadyExists, InvalidArgument, NotFound
from domain.params import Parameters, WritePolicy
from domain.policy import DISABLED
from domain.quota import QUOTA_SLOTS, SlottedQuota, TenantQuota, TenantQuotaSlot
from domain.reads import MemberReadState
from domain.tier import Tier
from fanout.activity import PendingActivity
from fanout.command_unit import retried
from fanout.gate import UserCommandGate
from fanout.history import History
from fanout.quota_slots import QuotaSlots
from fanout.tiers import TierCommands
from fanout.units import Unit

# Pending activity refreshes of MARK_READ are appended at most this often per conversation
# (ADR-0018, fanout/activity.py): a crash loses at most this much of them.
ACTIVITY_FLUSH_INTERVAL = 0.2


class FanoutApplication(TierCommands):
    name = "fanout"
    snapshotting_intervals = {
        Conversation: 200,
        TenantQuota: 2000,
        TenantQuotaSlot: 2000,
        Tier: 200,
        MemberReadState: 100,
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
        super().__init__(
            env, shared_store=shared_store, params=params, clock=clock, conversations_in_scope=conversations_in_scope
        )
        # The tenant bucket (ADR-0023): one TenantQuota stream per tenant for one writer (0);
        # K TenantQuotaSlot streams for replicas of a shared store, this one charging its own.
        slots = (QUOTA_SLOTS if shared_store else 0) if quota_slots is None else quota_slots
        self.quotas = QuotaSlots(self._find, slots, replica_id or uuid.uuid4().hex)
        self.message_sender = message_sender or (lambda tenant, cid, seq: None)
        # (read_seq, views position) of a member as the views show it, for coalescing MARK_READ
        self.read_state = read_state or (lambda tenant, cid, user: None)
        self.user_gate = UserCommandGate(params)
        # ADR-0018. 0 records a stale member's activity in the read's own unit (one
        # conversation append per such read); legacy_read_marks writes Conversation.ReadMarked
        # per read as before ADR-0018 (kept for bench/mark_read_scale.py only).
        self.activity_flush_interval = activity_flush_interval
        self.legacy_read_marks = legacy_read_marks
        self.activity = PendingActivity(self.lock, activity_flush_interval, self._flush_conversation)
        self.activity_events = 0  # MembersActive events saved
        self.history = History(self.recorder, self.mapper)  # the event store's answers no view keeps

    def _saved(self, unit: Unit) -> None:
        for key, applied, recorded in unit.activity:
            self.activity.saved(key, applied)
            self.activity_events += recorded

    def _replied_to(self, tenant: str, conversation_id: str, seq: int) -> str | None:
        """Who sent the message a reply points at: from the views (`message_sender`), or, when
        they have not applied it yet (a projector behind the log), from its MessageSent event
        in the store, so the replied-to member is materialized and counted whatever the lag."""
        sender = self.message_sender(tenant, conversation_id, seq)
        if sender is None:
            sent = self.history.sent_message(tenant, conversation_id, seq)
            sender = sent.sender if sent is not None else None
        return sender

    def _lost_race(self, aggregates: Sequence[object]) -> None:
        self.quotas.lost_race(aggregates)

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
            reply_to_user = self._replied_to(tenant, conversation_id, reply_to_seq)
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

    def _return_to_always(self, tenant: str, conversation_id: str, now: float, touched: Unit) -> None:
        """The rolled-back tier's conversation, back in `always` (fanout/tiers.py `roll_back_tier`)."""
        conv = self._conversation(tenant, conversation_id)
        self._apply_activity(conv, touched)
        if conv.evaluate_write_policy(DISABLED, now, self.params) is not None:
            touched.touch(conv)

    def conversation(self, tenant: str, conversation_id: str) -> Conversation:
        with self.lock:
            return self._conversation(tenant, conversation_id)
