"""The Conversation aggregate: membership, conversation_seq, admission gates and
the write-policy state machine (SPEC sections 3-4).

Why this module is long: the Conversation aggregate: membership, the send gates, the entries a
send creates and the write-policy state machine all act on one aggregate's state and events
(eventsourcing's shape); the rules themselves live in domain/admission.py, domain/delivery.py
and domain/policy.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

from domain.admission import TokenBucket, retry_after_ms
from domain.delivery import Targets, materialized_members
from domain.errors import FanoutQuotaExceeded, GroupFull, InvalidArgument, NotAMember, RateLimited
from domain.identity import MAX_ID_LENGTH as MAX_ID_LENGTH
from domain.identity import check_id as check_id
from domain.identity import scoped_name
from domain.params import Parameters, SizeBucket, WritePolicy
from domain.policy import Switch, TierTerms, alpha_of, decide
from domain.quota import Quota

NAMESPACE = UUID("6f6d2b1e-5a0c-4f57-9d43-3b3f0c1f2a10")

# Idempotency window of client_msg_id: the last this many messages per conversation.
CLIENT_MSG_ID_WINDOW = 10_000
# A MARK_READ that moves no read seq is recorded again (as activity) once the last
# recorded activity is older than this fraction of the activity window: 1% of 7 days is
# ~1.7 h, the most by which such a member's activity can expire early (ADR-0009).
READ_ACTIVITY_REFRESH = 0.01


class Conversation(Aggregate):
    class Created(Aggregate.Created):
        tenant: str
        conversation_id: str
        title: str
        at: float

    class MembersJoined(Aggregate.Event):
        user_ids: list[str]
        at_seq: int
        at: float

    class MemberLeft(Aggregate.Event):
        user_id: str
        at_seq: int
        at: float

    class MessageSent(Aggregate.Event):
        seq: int
        message_id: str
        sender: str
        text: str
        mentions: list[str]
        mention_all: bool
        reply_to_seq: int | None
        reply_to_user: str | None
        announcement: bool
        client_msg_id: str | None
        write_policy: str
        fanout_entries: int
        member_count: int
        rate: float
        sender_rate: list[float]
        at: float

    class ReadMarked(Aggregate.Event):
        user_id: str
        read_seq: int
        at: float

    class MembersActive(Aggregate.Event):
        """Activity of members recorded apart from their reads (ADR-0018): one event for
        many members' read activity, group-committed per conversation."""

        active: dict[str, float]  # user_id -> when the member was active
        at: float

    class RebuildRequested(Aggregate.Event):
        user_id: str
        at_seq: int
        at: float

    class WritePolicyChanged(Aggregate.Event):
        size_bucket: str
        from_policy: str
        to_policy: str
        at_seq: int
        reason: str
        alpha: float
        member_count: int
        n_eq: float | None
        at: float

    @staticmethod
    def create_id(tenant: str, conversation_id: str, *_: Any, **__: Any) -> UUID:
        # ADR-0008: the tenant has no '/', so this name is unambiguous (and unchanged for valid tenants).
        return uuid5(NAMESPACE, scoped_name("conversation", tenant, check_id(conversation_id, "conversation_id")))

    @event(Created)
    def __init__(self, tenant: str, conversation_id: str, title: str, at: float) -> None:
        self.tenant = tenant
        self.conversation_id = conversation_id
        self.title = title
        self.created_at = at
        self.members: dict[str, float] = {}  # user_id -> last_active (0.0 never)
        self.seq = 0
        self.write_policy = WritePolicy.ALWAYS.value
        self.last_switch_at: float | None = None
        self.policy_scope: str | None = None
        self.client_msg_ids: dict[str, list[Any]] = {}
        self.rate_bucket: list[float] | None = None
        self.sender_buckets: dict[str, list[float]] = {}

    # -- queries ---------------------------------------------------------

    @property
    def policy(self) -> WritePolicy:
        return WritePolicy(self.write_policy)

    def size_bucket(self, params: Parameters) -> SizeBucket:
        return params.size_bucket(len(self.members))

    def alpha(self, now: float, params: Parameters) -> float:
        return alpha_of(self.members.values(), now, params.activity_window)[1]

    def previous_send(self, client_msg_id: str | None) -> tuple[int, str, str] | None:
        """(conversation_seq, message_id, write_policy) of an earlier send with this client_msg_id."""
        if client_msg_id is None or client_msg_id not in self.client_msg_ids:
            return None
        seq, message_id, policy = self.client_msg_ids[client_msg_id]
        return int(seq), str(message_id), str(policy)

    # -- membership ------------------------------------------------------

    def join(self, user_ids: Sequence[str], now: float, params: Parameters) -> list[str]:
        new = [u for u in dict.fromkeys(check_id(u, "user_id") for u in user_ids) if u not in self.members]
        if not new:
            return []
        if len(self.members) + len(new) > params.max_group_members:
            raise GroupFull(
                f"joining {len(new)} members would exceed max_group_members={params.max_group_members}",
                member_count=len(self.members),
                requested=len(new),
                max_group_members=params.max_group_members,
            )
        self._members_joined(user_ids=new, at_seq=self.seq, at=now)
        return new

    @event(MembersJoined)
    def _members_joined(self, user_ids: list[str], at_seq: int, at: float) -> None:
        for u in user_ids:
            self.members[u] = 0.0

    def leave(self, user_id: str, now: float) -> None:
        if user_id not in self.members:
            raise NotAMember(f"{user_id} is not a member of {self.conversation_id}", user_id=user_id)
        self._member_left(user_id=user_id, at_seq=self.seq, at=now)

    @event(MemberLeft)
    def _member_left(self, user_id: str, at_seq: int, at: float) -> None:
        del self.members[user_id]
        # The sender bucket stays: leaving and rejoining must not reset the rate.

    # -- sending -----------------------------------------------------------

    def send(
        self,
        *,
        sender: str,
        text: str,
        message_id: str,
        quota: Quota,
        params: Parameters,
        now: float,
        mentions: Sequence[str] = (),
        mention_all: bool = False,
        reply_to_seq: int | None = None,
        reply_to_user: str | None = None,
        announcement: bool = False,
        client_msg_id: str | None = None,
    ) -> int:
        """Admit and sequence one message. Raises RateLimited / FanoutQuotaExceeded
        explicitly; never drops a recipient of an accepted message."""
        if sender not in self.members:
            raise NotAMember(f"sender {sender} is not a member of {self.conversation_id}", user_id=sender)
        if not isinstance(text, str) or not text:
            raise InvalidArgument("text must be a non-empty string", field="text")
        if len(text) > params.max_text_length:
            raise InvalidArgument(
                f"text is {len(text)} characters; the limit is {params.max_text_length}",
                field="text",
                max_text_length=params.max_text_length,
            )
        if reply_to_seq is not None and (
            isinstance(reply_to_seq, bool) or not isinstance(reply_to_seq, int) or not 1 <= reply_to_seq <= self.seq
        ):
            raise InvalidArgument(
                f"reply_to_seq must be between 1 and {self.seq}", field="reply_to_seq", latest=self.seq
            )
        bucket = self.size_bucket(params)
        rate = params.conversation_rate(bucket)
        conv_bucket = self._rate_bucket(rate, now)
        wait = conv_bucket.retry_after(1, now)
        if wait > 0:
            raise RateLimited(
                f"conversation {self.conversation_id} ({bucket.value}) admits {rate:g} msg/s",
                gate="per_conversation_msg_rate",
                retry_after_ms=retry_after_ms(wait),
            )
        sender_rate = params.per_sender_in_conversation_rate
        wait = self._sender_bucket(sender, sender_rate.count, sender_rate.per_second, now).retry_after(1, now)
        if wait > 0:
            raise RateLimited(
                f"{sender} may send {sender_rate.count:g} msg / {sender_rate.per_seconds:g} s here",
                gate="per_sender_in_conversation_rate",
                retry_after_ms=retry_after_ms(wait),
            )
        mentioned = sorted({m for m in mentions if m in self.members and m != sender})
        reply_user = reply_to_user if reply_to_user in self.members else None
        targets = Targets(sender, tuple(mentioned), reply_user, mention_all, announcement)
        entries = self._entries_for(targets, now, params)
        wait = quota.retry_after(entries, now, params)
        if wait > 0:
            why = (
                f"exceeds the tenant fan-out quota capacity ({params.tenant_fanout_quota_capacity:g}); "
                "raise FANOUT_TENANT_FANOUT_QUOTA_CAPACITY"
                if wait == float("inf")
                else "cannot be paid from the tenant fan-out quota now"
            )
            raise FanoutQuotaExceeded(
                f"{entries} mailbox entries for tenant {self.tenant} {why}",
                gate="tenant_fanout_quota",
                entries=entries,
                retry_after_ms=retry_after_ms(wait),
            )
        seq = self.seq + 1
        self._message_sent(
            seq=seq,
            message_id=message_id,
            sender=sender,
            text=text,
            mentions=mentioned,
            mention_all=mention_all,
            reply_to_seq=reply_to_seq,
            reply_to_user=reply_user,
            announcement=announcement,
            client_msg_id=client_msg_id,
            write_policy=self.write_policy,
            fanout_entries=entries,
            member_count=len(self.members),
            rate=rate,
            sender_rate=[sender_rate.count, sender_rate.per_second],
            at=now,
        )
        quota.charge(entries=entries, conversation_id=self.conversation_id, params=params, now=now)
        return seq

    def _entries_for(self, targets: Targets, now: float, params: Parameters) -> int:
        """The mailbox entries this message will create: what the tenant quota is charged."""
        if self.policy is WritePolicy.ALWAYS or targets.broadcast:
            return len(self.members)
        members = dict(self.members)
        members[targets.sender] = now  # sending is activity
        return sum(1 for _ in materialized_members(self.policy, members, targets, now, params.activity_window))

    def _rate_bucket(self, rate: float, now: float) -> TokenBucket:
        # A burst of at least one message, so a rate below 1 msg/s admits one message
        # every 1/rate s instead of none ever.
        return TokenBucket.resume(self.rate_bucket, max(rate, 1.0), rate, now)

    def _sender_bucket(self, sender: str, capacity: float, refill: float, now: float) -> TokenBucket:
        return TokenBucket.resume(self.sender_buckets.get(sender), capacity, refill, now)

    @event(MessageSent)
    def _message_sent(
        self,
        seq: int,
        message_id: str,
        sender: str,
        text: str,
        mentions: list[str],
        mention_all: bool,
        reply_to_seq: int | None,
        reply_to_user: str | None,
        announcement: bool,
        client_msg_id: str | None,
        write_policy: str,
        fanout_entries: int,
        member_count: int,
        rate: float,
        sender_rate: list[float],
        at: float,
    ) -> None:
        self.seq = seq
        conv_bucket = self._rate_bucket(rate, at)
        conv_bucket.take(1, at)
        self.rate_bucket = conv_bucket.to_state()
        sb = self._sender_bucket(sender, sender_rate[0], sender_rate[1], at)
        sb.take(1, at)
        self.sender_buckets[sender] = sb.to_state()
        if len(self.sender_buckets) > 1024:
            # Forget buckets that are full again: they would be recreated full anyway.
            self.sender_buckets = {
                s: st for s, st in self.sender_buckets.items() if TokenBucket.from_state(st).available(at) < st[0]
            }
        if sender in self.members:
            self.members[sender] = at
        if client_msg_id is not None:
            self.client_msg_ids[client_msg_id] = [seq, message_id, write_policy]
            if len(self.client_msg_ids) > CLIENT_MSG_ID_WINDOW:
                del self.client_msg_ids[next(iter(self.client_msg_ids))]

    # -- reading -------------------------------------------------------------

    def mark_read(self, user_id: str, read_seq: int, now: float) -> None:
        """The read mark as it was before ADR-0018 (one conversation event per read): the
        application records reads in MemberReadState streams now; this stays for the
        comparison bench (bench/mark_read_scale.py) and the logs that hold ReadMarked."""
        self.check_read(user_id, read_seq)
        self._read_marked(user_id=user_id, read_seq=read_seq, at=now)

    def check_read(self, user_id: str, read_seq: int) -> None:
        if user_id not in self.members:
            raise NotAMember(f"{user_id} is not a member of {self.conversation_id}", user_id=user_id)
        if isinstance(read_seq, bool) or not isinstance(read_seq, int) or read_seq < 0:
            raise InvalidArgument("read_seq must be a non-negative integer", field="read_seq")
        if read_seq > self.seq:
            raise InvalidArgument(
                f"read_seq {read_seq} is beyond the latest conversation_seq {self.seq}",
                field="read_seq",
                latest_conversation_seq=self.seq,
            )

    def activity_is_recent(self, user_id: str, now: float, params: Parameters, pending: float = 0.0) -> bool:
        """Whether the member's recorded activity (or `pending`, activity recorded but not
        yet appended) is younger than READ_ACTIVITY_REFRESH of the activity window: a read
        then needs no new activity record (ADR-0009, ADR-0018)."""
        last_active = max(self.members[user_id], pending)
        return last_active > 0.0 and now - last_active < params.activity_window * READ_ACTIVITY_REFRESH

    def record_activity(self, active: dict[str, float], now: float) -> dict[str, float]:
        """Record members' activity (user -> when): one MembersActive event for all of them,
        none when nothing is newer than what is recorded. Returns what was recorded."""
        newer = {u: float(t) for u, t in sorted(active.items()) if u in self.members and t > self.members[u]}
        if newer:
            self._members_active(active=newer, at=now)
        return newer

    @event(MembersActive)
    def _members_active(self, active: dict[str, float], at: float) -> None:
        for u, t in active.items():
            if u in self.members:
                self.members[u] = t

    def read_changes_nothing(
        self,
        user_id: str,
        read_seq: int,
        known_read_seq: int | None,
        now: float,
        params: Parameters,
        pending_activity: float = 0.0,
    ) -> bool:
        """Whether a (valid) MARK_READ would change nothing, so it can be coalesced.

        `known_read_seq` is the member's read seq as the views show it: a lower bound of
        the true one (the views are a prefix of the log and read seqs only grow), so a
        read_seq at or below it moves nothing. MARK_READ is also activity (alpha, who is
        materialized in mention_only): it counts as "nothing" only while the last recorded
        activity is younger than READ_ACTIVITY_REFRESH of the activity window (ADR-0009)."""
        self.check_read(user_id, read_seq)
        if known_read_seq is None or read_seq > known_read_seq:
            return False
        return self.activity_is_recent(user_id, now, params, pending_activity)

    @event(ReadMarked)
    def _read_marked(self, user_id: str, read_seq: int, at: float) -> None:
        if user_id in self.members:
            self.members[user_id] = at

    def request_rebuild(self, user_id: str, now: float) -> None:
        """REBUILD: recompute this member's UserConversationState from the log."""
        if user_id not in self.members:
            raise NotAMember(f"{user_id} is not a member of {self.conversation_id}", user_id=user_id)
        self._rebuild_requested(user_id=user_id, at_seq=self.seq, at=now)

    @event(RebuildRequested)
    def _rebuild_requested(self, user_id: str, at_seq: int, at: float) -> None:
        pass

    # -- write policy ------------------------------------------------------

    def evaluate_write_policy(self, tier: TierTerms, now: float, params: Parameters) -> Switch | None:
        """Evaluated at membership changes, sends, alpha updates and tier changes.
        `tier` is the tier of the scope this conversation is governed by: the one it
        entered mention_only under, or its current size bucket's when in always."""
        if self.policy is WritePolicy.ALWAYS and not tier.enabled:
            return None  # nothing to decide: skip the O(N) alpha pass on the hot path
        n, alpha = alpha_of(self.members.values(), now, params.activity_window)
        switch = decide(self.policy, tier, n, alpha, now, self.last_switch_at, params)
        if switch is not None:
            self._write_policy_changed(
                size_bucket=self.policy_scope if self.policy_scope else self.size_bucket(params).value,
                from_policy=self.write_policy,
                to_policy=switch.to.value,
                at_seq=self.seq,
                reason=switch.reason,
                alpha=alpha,
                member_count=n,
                n_eq=switch.n_eq if switch.n_eq != float("inf") else None,
                at=now,
            )
        return switch

    @event(WritePolicyChanged)
    def _write_policy_changed(
        self,
        size_bucket: str,
        from_policy: str,
        to_policy: str,
        at_seq: int,
        reason: str,
        alpha: float,
        member_count: int,
        n_eq: float | None,
        at: float,
    ) -> None:
        self.write_policy = to_policy
        self.last_switch_at = at
        # The scope (size bucket) whose tier governs mention_only until the exit.
        self.policy_scope = size_bucket if to_policy == WritePolicy.MENTION_ONLY.value else None
