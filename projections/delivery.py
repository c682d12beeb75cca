"""The delivery projection: message bodies (stored once), ConversationHead,
UserMailboxEntry per MailboxShard, UserConversationState and the per-message
delivery record. Written once, hosted by the embedded runner (and later Faust).

It keeps each conversation's members in memory (loaded from the view store on
first use), grouped per MailboxShard and sorted in mailbox key order, so the fan-out
of one message in `always` needs no per-member work here: the member lists go to the
mailbox store as they are, and the only O(N) write is the mailbox reference.

Why this module is long: the delivery projection: one class folding every event kind into the
bodies, heads, states, mailbox references and delivery records; the rules it applies are
domain/'s (delivery.py, policy.py), the row types projections/rows.py's."""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
from functools import singledispatchmethod
from typing import Any, cast

from domain.conversation import Conversation
from domain.delivery import ANNOUNCEMENT, MENTION_ALL, Targets, materialized_members
from domain.params import Parameters, WritePolicy
from domain.policy import is_active
from domain.reads import READ_EVENTS, MemberReadState
from projections.ports import MessageRefs, ViewStore, ViewWriter
from projections.rows import DeliveryRecord, MessageRow
from projections.sharding import shard_of
from projections.state import UserConversationState, activity_bucket

PREVIEW_LENGTH = 80
_LIST_VERSIONS = itertools.count(1)


@dataclass
class ConversationModel:
    tenant: str
    conversation_id: str
    head: dict[str, Any]
    members: dict[str, UserConversationState] = field(default_factory=dict)
    broadcast_seqs: list[int] = field(default_factory=list)
    shards: dict[str, int] = field(default_factory=dict)  # user -> MailboxShard, cached
    skipping: set[str] = field(default_factory=set)  # members with an open gap
    _by_shard: dict[int, list[str]] | None = None
    _unsorted: set[int] = field(default_factory=set)
    # Shard lists handed to a queued mailbox write or a push record: a later join or leave
    # in the same unit of work must copy them first, not change a message's recipients.
    _handed: set[int] = field(default_factory=set)
    # A process-wide unique number per shard list state, so a cache keyed by it can never
    # confuse this list with another model's (e.g. after a reset reloads the members).
    shard_versions: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.skipping = {u for u, s in self.members.items() if s.skipping}

    def broadcasts_upto(self, seq: int) -> int:
        return bisect_right(self.broadcast_seqs, seq)

    def shard(self, user_id: str, n_shards: int) -> int:
        s = self.shards.get(user_id)
        if s is None:
            s = self.shards[user_id] = shard_of(user_id, n_shards)
        return s

    def shard_lists(self, n_shards: int) -> dict[int, list[str]]:
        """Members per MailboxShard, each list sorted by user id (the mailbox key
        order), built once and kept up to date on join/leave."""
        if self._by_shard is None:
            by: dict[int, list[str]] = {}
            for u in self.members:
                by.setdefault(self.shard(u, n_shards), []).append(u)
            self._by_shard = by
            self._unsorted = set(by)
            for shard in by:
                self.shard_versions[shard] = next(_LIST_VERSIONS)
        for shard in self._unsorted:
            self._by_shard[shard].sort()
        self._unsorted.clear()
        return self._by_shard

    def members_at_send(self, n_shards: int) -> dict[int, list[str]]:
        """The member lists as of now, frozen by copy-on-write: O(shards), not O(N).
        The lists must not be mutated by the caller."""
        lists = self.shard_lists(n_shards)
        self._handed.update(lists)
        return dict(lists)

    def _writable(self, shard: int) -> list[str]:
        assert self._by_shard is not None
        lst = self._by_shard.setdefault(shard, [])
        if shard in self._handed:
            lst = self._by_shard[shard] = list(lst)
            self._handed.discard(shard)
        return lst

    def joined(self, users: list[str], n_shards: int) -> None:
        if self._by_shard is not None:
            for u in users:
                shard = self.shard(u, n_shards)
                self._writable(shard).append(u)
                self._unsorted.add(shard)
                self.shard_versions[shard] = next(_LIST_VERSIONS)

    def left(self, user_id: str, n_shards: int) -> None:
        if self._by_shard is not None:
            shard = self.shard(user_id, n_shards)
            lst = self._by_shard.get(shard)
            if lst is not None and user_id in lst:
                self._writable(shard).remove(user_id)
                self.shard_versions[shard] = next(_LIST_VERSIONS)


@dataclass(frozen=True)
class Delivered:
    """After commit: what the push hub may send (online push only after durability).
    Plain data: the members are those at send time, per MailboxShard, sorted."""

    tenant: str
    conversation_id: str
    seq: int
    message: dict[str, Any]
    materialized: frozenset[str] | None  # None: every member
    members_by_shard: dict[int, list[str]]
    mailbox_shards: int

    def was_member(self, user_id: str) -> bool:
        """Whether the user was a member when the message was sent."""
        lst = self.members_by_shard.get(shard_of(user_id, self.mailbox_shards))
        if not lst:
            return False
        i = bisect_left(lst, user_id)
        return i < len(lst) and lst[i] == user_id


def _add_once(seqs: list[int], seq: int) -> None:
    """Insert seq into a sorted list unless present: folding an event twice (a replay
    over views that already hold it) leaves the list as folding it once."""
    i = bisect_left(seqs, seq)
    if i == len(seqs) or seqs[i] != seq:
        insort(seqs, seq, lo=i)


class DeliveryProjection:
    name = "delivery"
    topics: tuple[type, ...] = (
        Conversation.Created,
        Conversation.MembersJoined,
        Conversation.MemberLeft,
        Conversation.MessageSent,
        Conversation.ReadMarked,  # logs written before ADR-0018
        Conversation.MembersActive,
        Conversation.RebuildRequested,
        Conversation.WritePolicyChanged,
        *READ_EVENTS,
    )

    def __init__(self, store: ViewStore, params: Parameters) -> None:
        self.store = store
        self.params = params
        self.models: dict[tuple[str, str], ConversationModel] = {}
        self.ids: dict[Any, tuple[str, str]] = {}
        self.absent: set[tuple[str, str]] = set()  # conversations known to have no views yet

    # -- working set -------------------------------------------------------

    def model(self, tenant: str, conversation_id: str) -> ConversationModel:
        key = (tenant, conversation_id)
        m = self.models.get(key)
        if m is None:
            m = self._load(key)
            if m is None:
                raise LookupError(f"no head for {tenant}/{conversation_id}: the log is ahead of the views")
        return m

    def _load(self, key: tuple[str, str]) -> ConversationModel | None:
        head, states, broadcasts = self.store.load_conversation(*key)
        if head is None:
            self.absent.add(key)
            return None
        m = self.models[key] = ConversationModel(key[0], key[1], dict(head), dict(states), broadcasts)
        self.absent.discard(key)
        return m

    def forget(self, conversation_ids: set[Any] | None = None) -> None:
        """Drop working sets (all, or those of these aggregate ids): a revoked partition's
        conversations are reloaded from the views by whoever is assigned them next."""
        if conversation_ids is None:
            self.models.clear()
            self.ids.clear()
            self.absent.clear()
            return
        for aggregate_id in conversation_ids:
            key = self.ids.pop(aggregate_id, None)
            if key is not None:
                self.models.pop(key, None)

    # -- dispatch ------------------------------------------------------------

    def process(self, event: Any, position: int, w: ViewWriter) -> list[Delivered]:
        return self._process(event, position, w) or []

    def flush(self, w: ViewWriter) -> None:
        pass  # every write goes through the writer as it happens

    @singledispatchmethod
    def _process(self, event: Any, position: int, w: ViewWriter) -> list[Delivered] | None:
        return None

    @_process.register
    def _created(self, e: Conversation.Created, position: int, w: ViewWriter) -> None:
        key = (e.tenant, e.conversation_id)
        existing = self.models.get(key)
        if existing is None and key not in self.absent:
            existing = self._load(key)
        if existing is not None and existing.head.get("position", 0) >= position:
            self._put_again(existing, w)  # applied before (at-least-once delivery): written, but see _put_again
            return
        self.absent.discard(key)
        head = {
            "conversation_id": e.conversation_id,
            "title": e.title,
            "latest_conversation_seq": 0,
            "last_activity_id": None,
            "last_activity_at": e.at,
            "preview": None,
            "member_count": 0,
            "size_bucket": self.params.size_bucket(0).value,
            "write_policy": WritePolicy.ALWAYS.value,
            "broadcasts": 0,
            "created_at": e.at,
            "position": position,
        }
        head["aggregate_id"] = str(e.originator_id)
        self.models[(e.tenant, e.conversation_id)] = ConversationModel(e.tenant, e.conversation_id, head)
        self.ids[e.originator_id] = (e.tenant, e.conversation_id)
        w.put_head(e.tenant, e.conversation_id, head)

    def _conv(self, e: Any, position: int, w: ViewWriter) -> ConversationModel | None:
        """The conversation's working set, or None when this event was applied before:
        its head records the position of the last event applied to it, so a replay
        (at-least-once delivery, or a unit of work whose views committed but whose
        tracking did not) changes nothing. A member's read event names its conversation
        (and reaches the conversation's partition: the relay keys it by the conversation)."""
        if isinstance(e, MemberReadState.Event):
            key: tuple[str, str] = (e.tenant, e.conversation_id)
        else:
            known = self.ids.get(e.originator_id)
            key = known if known is not None else self.store.conversation_key(e.originator_id)
            self.ids[e.originator_id] = key
        m = self.model(*key)
        if position <= m.head.get("position", 0):
            self._put_again(m, w)
            return None
        return m

    def _put_again(self, m: ConversationModel, w: ViewWriter) -> None:
        """An event applied before is replayed: the unit that applied it wrote its head, but a
        store that commits in rounds may have lost what it writes after the heads (Cassandra's
        session heads' copy, ADR-0042) with the tracking. The head is put again as the views
        hold it (its position unchanged), so whatever a store derives from a head put is
        written again; everything else of the event is already there (ADR-0051)."""
        w.put_head(m.tenant, m.conversation_id, m.head, lookups=False)

    def _put_head(self, m: ConversationModel, w: ViewWriter, position: int) -> None:
        """Every event of a conversation ends by writing its head, with its position; what
        the head is found by (its aggregate id, its size bucket) only when that changed: the
        bucket (ADR-0049; the aggregate id is the creation's, written by `_created`)."""
        bucket = self.params.size_bucket(len(m.members)).value
        moved = m.head.get("size_bucket") != bucket
        m.head["member_count"] = len(m.members)
        m.head["size_bucket"] = bucket
        m.head["position"] = position
        w.put_head(m.tenant, m.conversation_id, m.head, lookups=moved)

    @_process.register
    def _joined(self, e: Conversation.MembersJoined, position: int, w: ViewWriter) -> None:
        m = self._conv(e, position, w)
        if m is None:
            return
        base = m.broadcasts_upto(e.at_seq)
        new = [
            (u, UserConversationState(read_conversation_seq=e.at_seq, joined_seq=e.at_seq, broadcast_base=base))
            for u in e.user_ids
        ]
        for u, s in new:
            m.members[u] = s
        m.joined(e.user_ids, self.params.mailbox_shards)
        w.put_states(m.tenant, m.conversation_id, new)
        w.put_activity(m.tenant, m.conversation_id, e.user_ids, activity_bucket(m.head["last_activity_at"]), None)
        self._put_head(m, w, position)

    @_process.register
    def _left(self, e: Conversation.MemberLeft, position: int, w: ViewWriter) -> None:
        m = self._conv(e, position, w)
        if m is None:
            return
        if m.members.pop(e.user_id, None) is not None:
            m.left(e.user_id, self.params.mailbox_shards)
            w.delete_activity(m.tenant, m.conversation_id, e.user_id, activity_bucket(m.head["last_activity_at"]))
        m.skipping.discard(e.user_id)
        w.delete_state(m.tenant, m.conversation_id, e.user_id)
        self._put_head(m, w, position)

    @_process.register
    def _sent(self, e: Conversation.MessageSent, position: int, w: ViewWriter) -> list[Delivered]:
        m = self._conv(e, position, w)
        if m is None:
            return []
        tenant, cid, seq = m.tenant, m.conversation_id, e.seq
        broadcast = e.mention_all or e.announcement
        message = MessageRow(
            conversation_id=cid,
            conversation_seq=seq,
            message_id=e.message_id,
            sender=e.sender,
            text=e.text,
            mentions=list(e.mentions),
            mention_all=e.mention_all,
            reply_to_seq=e.reply_to_seq,
            announcement=e.announcement,
            sent_at=e.at,
            pos=position,
        )
        w.put_message(tenant, cid, message)
        if broadcast:
            # A replay after a partial commit (the message landed, the head did not) loaded
            # this broadcast from the messages already: count it once.
            _add_once(m.broadcast_seqs, seq)
            m.head["broadcasts"] = len(m.broadcast_seqs)
        previous = activity_bucket(m.head["last_activity_at"])
        m.head.update(
            latest_conversation_seq=seq,
            last_activity_id=e.message_id,
            last_activity_at=e.at,
            preview=e.text[:PREVIEW_LENGTH],
        )
        self._put_head(m, w, position)
        if activity_bucket(e.at) != previous:  # the login index: the members' rows move with it
            w.put_activity(tenant, cid, list(m.members), activity_bucket(e.at), previous)

        targets = Targets(e.sender, tuple(e.mentions), e.reply_to_user, e.mention_all, e.announcement)
        policy = WritePolicy(e.write_policy)
        sender_state = m.members.get(e.sender)
        if sender_state is not None:
            sender_state.last_active = e.at
        everyone = policy is WritePolicy.ALWAYS or broadcast
        materialized = None
        if not everyone:
            activity = {u: st.last_active for u, st in m.members.items()}
            materialized = frozenset(materialized_members(policy, activity, targets, e.at, self.params.activity_window))
        members = m.members_at_send(self.params.mailbox_shards)
        shards = members if materialized is None else self._recipients_by_shard(m, materialized)
        base = (ANNOUNCEMENT if targets.announcement else 0) | (MENTION_ALL if targets.mention_all else 0)
        special = {
            u: targets.flags_for(u)
            for u in (*targets.personal(), targets.sender)
            if u in m.members and (materialized is None or u in materialized)
        }
        entries = sum(len(b) for b in shards.values())
        versions = dict(m.shard_versions) if materialized is None else None
        w.put_mailbox(tenant, MessageRefs(cid, position, seq, base, special, shards, versions, e.at))

        # Gap transitions first (a narrow update of three columns, possibly for many
        # members at a switch), then the few full rows (sender, mentioned), which win.
        gaps = self._gap_transitions(m, seq, e.at, e.sender, materialized)
        if gaps:
            w.put_gaps(tenant, cid, [(u, m.members[u]) for u in gaps])
        changed: dict[str, UserConversationState] = {}
        if sender_state is not None:
            # Sending marks the conversation read for the sender (ADR 0002).
            self._advance_read(m, sender_state, seq)
            changed[e.sender] = sender_state
        personal = targets.personal() if not broadcast else set()
        for u in personal:
            s = m.members.get(u)
            if s is not None:
                # Idempotent: a replayed state may hold this mention already (or have read past it).
                if seq > s.read_conversation_seq:
                    _add_once(s.mention_seqs, seq)
                changed[u] = s
        if changed:
            w.put_states(tenant, cid, list(changed.items()))
        record = DeliveryRecord(
            message_id=e.message_id,
            write_policy=e.write_policy,
            member_count=len(m.members),
            mailbox_entries=entries,
            shards=len(shards),
            body_bytes=len(e.text.encode()),
            pos=position,
        )
        w.put_delivery(tenant, cid, seq, record)
        return [
            Delivered(
                tenant, cid, seq, cast(dict[str, Any], message), materialized, members, self.params.mailbox_shards
            )
        ]

    def _recipients_by_shard(self, m: ConversationModel, materialized: frozenset[str]) -> dict[int, list[str]]:
        """The materialized recipients of a mention_only message, per MailboxShard. (In
        always the standing member lists are the recipients: no per-member work.)"""
        n_shards = self.params.mailbox_shards
        out: dict[int, list[str]] = {}
        for u in sorted(materialized):
            out.setdefault(m.shard(u, n_shards), []).append(u)
        return out

    def _gap_transitions(
        self, m: ConversationModel, seq: int, at: float, sender: str, materialized: frozenset[str] | None
    ) -> list[str]:
        """Members whose row changes because they start or stop being skipped."""
        changed: list[str] = []
        if materialized is None:  # everyone got this message: open gaps end before it
            for u in m.skipping:
                s = m.members[u]
                s.skipping = False
                s.gap_end = seq - 1
                changed.append(u)
            m.skipping.clear()
            return changed
        window = self.params.activity_window
        for u, s in m.members.items():
            if u not in materialized:
                if not s.skipping:
                    s.skipping = True
                    if s.delivered_conversation_seq is None:
                        s.delivered_conversation_seq = seq - 1
                    m.skipping.add(u)
                    changed.append(u)
            elif s.skipping and (u == sender or is_active(s.last_active, at, window)):
                # Materialized because active again, not only because mentioned.
                s.skipping = False
                s.gap_end = seq - 1
                m.skipping.discard(u)
                changed.append(u)
        return changed

    def _member(self, e: Any, position: int, w: ViewWriter) -> tuple[ConversationModel, UserConversationState] | None:
        """The conversation's working set and the state of the event's member (`e.user_id`);
        None when the event was applied before (`_conv`) or the user is no member."""
        m = self._conv(e, position, w)
        s = None if m is None else m.members.get(e.user_id)
        return None if m is None or s is None else (m, s)

    def _advance_read(self, m: ConversationModel, s: UserConversationState, read_seq: int) -> None:
        if read_seq <= s.read_conversation_seq:
            return
        s.read_conversation_seq = read_seq
        s.mention_seqs = [x for x in s.mention_seqs if x > read_seq]
        s.broadcast_base = m.broadcasts_upto(read_seq)

    @_process.register
    def _read(self, e: Conversation.ReadMarked, position: int, w: ViewWriter) -> None:
        self._read_to(e, e.at, position, w)

    @_process.register
    def _member_read(self, e: MemberReadState.Event, position: int, w: ViewWriter) -> None:
        """A member's read (ADR-0018): the read seq as Conversation.ReadMarked moved it. Not
        activity here: the activity a read is reaches the views (and the Conversation
        aggregate, at the same log position) as Conversation.MembersActive, so the views'
        last_active, which materializes mention_only messages, stays the aggregate's."""
        self._read_to(e, None, position, w)

    def _read_to(
        self, e: Conversation.ReadMarked | MemberReadState.Event, active_at: float | None, position: int, w: ViewWriter
    ) -> None:
        """The member's read moved to e.read_seq (and their last activity to `active_at`
        when the read is activity)."""
        found = self._member(e, position, w)
        if found is None:
            return
        m, s = found
        if active_at is not None:
            s.last_active = active_at
        self._advance_read(m, s, e.read_seq)
        # The gap stays flagged: the mailbox really lacks those entries, and another
        # device of this user may not hold them (ADR 0002). Unread is exact again once
        # read_seq passes the gap's end.
        w.put_states(m.tenant, m.conversation_id, [(e.user_id, s)])
        self._put_head(m, w, position)

    @_process.register
    def _members_active(self, e: Conversation.MembersActive, position: int, w: ViewWriter) -> None:
        m = self._conv(e, position, w)
        if m is None:
            return
        changed = []
        for u, at in e.active.items():
            s = m.members.get(u)
            if s is not None:
                s.last_active = at
                changed.append((u, s))
        if changed:
            w.put_states(m.tenant, m.conversation_id, changed)
        self._put_head(m, w, position)

    @_process.register
    def _rebuild(self, e: Conversation.RebuildRequested, position: int, w: ViewWriter) -> None:
        found = self._member(e, position, w)
        if found is None:
            return
        m, s = found
        # Counts are recomputed from the log (mention seqs and broadcasts are
        # kept exactly); unread is exact as of at_seq. The gap stays flagged.
        s.rebuilt_seq = e.at_seq
        s.mention_seqs = sorted(x for x in set(s.mention_seqs) if x > s.read_conversation_seq)
        s.broadcast_base = m.broadcasts_upto(s.read_conversation_seq)
        w.put_states(m.tenant, m.conversation_id, [(e.user_id, s)])
        self._put_head(m, w, position)

    @_process.register
    def _policy(self, e: Conversation.WritePolicyChanged, position: int, w: ViewWriter) -> None:
        m = self._conv(e, position, w)
        if m is None:
            return
        m.head["write_policy"] = e.to_policy
        self._put_head(m, w, position)
