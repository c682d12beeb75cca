"""In-memory backend of the read side, like eventsourcing's POPO recorders: the views
and the mailbox in dicts behind one lock. The second backend of every contract suite
(tests/contract/) and the store of the fast unit tests of the projections.

A unit of work buffers its writes and applies them, with the tracking positions, at
commit: all or nothing, like the SQLite views. Readers take the lock for each read;
the runner thread and reader threads can share one store.

Why this module is long: it is every port of the read side (the mailbox, the views, their
writer) in memory, the second backend of each contract suite, a class each."""

from __future__ import annotations

import bisect
import copy
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from projections.ports import ALL_TARGETS, LogPosition, MailboxEntry, MailboxTimer, MessageRefs, timed_write
from projections.rows import HEAD_COLUMNS, DeliveryRecord, MessageRow, delivery_dict, head_dict, message_dict
from projections.state import SessionHead, SessionItem, UserConversationState, sessions_by_two_reads

Key = tuple[str, str]  # (tenant, conversation_id)


class MemoryMailbox:
    """UserMailboxEntry in a dict per (tenant, user_id): pos -> (seq, conversation_id, flags)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], dict[int, tuple[int, str, int]]] = {}
        self._sorted: dict[tuple[str, str], list[int]] = {}
        self._written: int | None = None

    def write(self, tenant: str, refs: MessageRefs) -> int:
        n = 0
        with self._lock:
            self._written = refs.pos if self._written is None else max(self._written, refs.pos)
            for shard in sorted(refs.shards):
                for u in refs.shards[shard]:
                    box = self._entries.setdefault((tenant, u), {})
                    if refs.pos not in box:
                        box[refs.pos] = (refs.seq, refs.conversation_id, refs.special.get(u, refs.flags))
                        bisect.insort(self._sorted.setdefault((tenant, u), []), refs.pos)
                    n += 1
        return n

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        with self._lock:
            box = self._entries.get((tenant, user_id), {})
            order = self._sorted.get((tenant, user_id), [])
            start = bisect.bisect_right(order, after)
            out: list[MailboxEntry] = []
            for pos in order[start:]:
                if pos > until or len(out) == limit:
                    break
                seq, cid, flags = box[pos]
                out.append((user_id, pos, seq, cid, flags))
            return out

    def count(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._entries.values())

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        with self._lock:
            rows = [
                (tenant, user, pos, *self._entries[(tenant, user)][pos])
                for (tenant, user) in sorted(self._entries)
                for pos in self._sorted[(tenant, user)]
            ]
        yield from rows

    def written(self) -> int | None:
        return self._written

    def sort_key(self, tenant: str, user_id: str, pos: int) -> tuple[str, str, int]:
        return (tenant, user_id, pos)

    def flush(self) -> None:
        pass

    def reopen(self) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryWriter:
    """The ViewWriter of one unit of work: every write is queued, applied at commit."""

    def __init__(self, targets: frozenset[str]) -> None:
        self.targets = targets
        self.ops: list[Callable[[MemoryViews], None]] = []
        self.mailbox: list[tuple[str, MessageRefs]] = []
        self.mailbox_entries = 0
        self.deliveries: list[tuple[str, str, int]] = []
        self.positions: dict[tuple[str, int], int] = {}
        self.log_positions: dict[int, LogPosition] = {}
        self.partition = 0
        self.head_keys: set[tuple[str, str]] = set()  # the heads put (heads_written)

    def applying(self, partition: int, above: int) -> None:
        self.partition = partition

    def track(self, projection: str, position: int, partition: int = 0) -> None:
        self.positions[(projection, partition)] = position

    def track_log(self, partition: int, position: int, next_offset: int) -> None:
        self.log_positions[partition] = LogPosition(position, next_offset)

    def _queue(self, part: str, op: Callable[[MemoryViews], None]) -> None:
        if part in self.targets:
            self.ops.append(op)

    def put_capacity(self, name: str, body: dict[str, Any]) -> None:
        stored = _json(body)
        self.ops.append(lambda v: v.capacity.__setitem__(name, stored))

    def heads_written(self) -> Iterable[tuple[str, str]]:
        return self.head_keys

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, Any], *, lookups: bool = True) -> None:
        # the lookups are dicts of this one row (put_head_row): kept with it, whatever `lookups` says
        self.head_keys.add((tenant, conversation_id))
        row = {
            "tenant": tenant,
            "conversation_id": conversation_id,
            **{c: copy.deepcopy(head.get(c)) for c in HEAD_COLUMNS},
        }
        self._queue("heads", lambda v: v.put_head_row(row))

    def put_message(self, tenant: str, conversation_id: str, message: MessageRow) -> None:
        m: dict[str, Any] = copy.deepcopy(dict(message))
        self._queue(
            "heads",
            lambda v: v.message_rows.setdefault((tenant, conversation_id), {}).__setitem__(m["conversation_seq"], m),
        )

    def put_mailbox(self, tenant: str, refs: MessageRefs) -> None:
        if "mailbox" not in self.targets or not refs.shards:
            return
        self.mailbox.append((tenant, refs))
        self.mailbox_entries += sum(len(b) for b in refs.shards.values())

    def put_states(
        self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]
    ) -> None:
        rows = [(u, copy.deepcopy(s)) for u, s in states]
        self._queue("state", lambda v: v.put_state_rows(tenant, conversation_id, rows))

    def put_gaps(self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]) -> None:
        gaps = [(u, s.delivered_conversation_seq, s.skipping, s.gap_end) for u, s in states]
        self._queue("state", lambda v: v.put_gap_rows(tenant, conversation_id, gaps))

    def delete_state(self, tenant: str, conversation_id: str, user_id: str) -> None:
        self._queue("state", lambda v: v.delete_state_row(tenant, conversation_id, user_id))

    def put_activity(
        self, tenant: str, conversation_id: str, user_ids: Sequence[str], bucket: int, previous: int | None
    ) -> None:
        """No login index here: the login read is a walk over dicts in memory (ADR-0028)."""

    def delete_activity(self, tenant: str, conversation_id: str, user_id: str, bucket: int) -> None:
        """No login index here (put_activity)."""

    def put_delivery(self, tenant: str, conversation_id: str, seq: int, record: DeliveryRecord) -> None:
        if "heads" not in self.targets:
            return
        row = {**record, "online_pushes": None, "materialized_at": None}
        self.ops.append(lambda v: v.delivery_rows.__setitem__((tenant, conversation_id, seq), row))
        self.deliveries.append((tenant, conversation_id, seq))

    def put_review(self, review: dict[str, Any]) -> None:
        r = _json(review)
        self._queue("heads", lambda v: v.put_review_row(r))

    def put_tier(self, tier: dict[str, Any]) -> None:
        t = _json(tier)
        self._queue("heads", lambda v: v.tiers.setdefault(t["tier_id"], {}).update(t))


class MemoryViews:
    """A ViewStore in memory (plus its mailbox store)."""

    atomic_units = True  # a unit's writes are applied at its end, all of them

    def __init__(
        self, mailbox: MemoryMailbox | None = None, *, partitions: int = 1, timer: MailboxTimer | None = None
    ) -> None:
        """`partitions`: the log's partition count (the views' position is the minimum over them);
        `timer` is told how long each mailbox write of a unit took."""
        self.mailbox = mailbox if mailbox is not None else MemoryMailbox()
        self.partitions = partitions
        self.timer = timer
        self._lock = threading.RLock()
        self.tracking: dict[tuple[str, int], int] = {}
        self.log_positions: dict[int, LogPosition] = {}
        self.heads_rows: dict[Key, dict[str, Any]] = {}
        self.by_aggregate: dict[str, Key] = {}
        self.message_rows: dict[Key, dict[int, dict[str, Any]]] = {}
        self.states: dict[Key, dict[str, UserConversationState]] = {}  # by conversation
        self.by_user: dict[tuple[str, str], dict[str, UserConversationState]] = {}  # (tenant, user) -> cid -> state
        self.delivery_rows: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.reviews_rows: dict[str, dict[str, Any]] = {}
        self.tiers: dict[str, dict[str, Any]] = {}
        self.capacity: dict[str, dict[str, Any]] = {}

    # -- writing (applied under the lock, at commit) ----------------------------------

    @contextmanager
    def unit_of_work(
        self,
        targets: frozenset[str] = ALL_TARGETS,
        *,
        now: float | None = None,
        checkpoint: Callable[[str], None] | None = None,  # one commit step: never called
    ) -> Iterator[MemoryWriter]:
        w = MemoryWriter(targets)
        yield w  # an exception here leaves everything as it was
        for tenant, refs in w.mailbox:  # durable first, idempotent (as the SQLite views do)
            timed_write(self.mailbox, tenant, refs, self.timer)
        at = now if now is not None else time.time()
        with self._lock:
            for op in w.ops:
                op(self)
            for d in w.deliveries:
                if d in self.delivery_rows:
                    self.delivery_rows[d]["materialized_at"] = at
            self.tracking.update(w.positions)
            self.log_positions.update(w.log_positions)

    def put_head_row(self, row: dict[str, Any]) -> None:
        key = (row["tenant"], row["conversation_id"])
        self.heads_rows[key] = row
        self.by_aggregate[str(row["aggregate_id"])] = key

    def put_state_rows(self, tenant: str, cid: str, rows: list[tuple[str, UserConversationState]]) -> None:
        for u, s in rows:
            self.states.setdefault((tenant, cid), {})[u] = s
            self.by_user.setdefault((tenant, u), {})[cid] = s

    def put_gap_rows(self, tenant: str, cid: str, gaps: list[tuple[str, int | None, bool, int | None]]) -> None:
        for u, delivered, skipping, gap_end in gaps:
            s = self.states.get((tenant, cid), {}).get(u)
            if s is not None:
                s.delivered_conversation_seq, s.skipping, s.gap_end = delivered, skipping, gap_end

    def delete_state_row(self, tenant: str, cid: str, user_id: str) -> None:
        self.states.get((tenant, cid), {}).pop(user_id, None)
        self.by_user.get((tenant, user_id), {}).pop(cid, None)

    def put_review_row(self, review: dict[str, Any]) -> None:
        self.reviews_rows.pop(review["review_id"], None)  # the one written last goes last
        self.reviews_rows[review["review_id"]] = review

    def record_pushes(self, tenant: str, conversation_id: str, seq: int, pushes: int) -> None:
        with self._lock:
            row = self.delivery_rows.get((tenant, conversation_id, seq))
            if row is not None:
                row["online_pushes"] = (row["online_pushes"] or 0) + pushes

    def compare_and_put_capacity(self, name: str, expected: dict[str, Any] | None, body: dict[str, Any]) -> bool:
        with self._lock:
            if self.capacity.get(name) != (None if expected is None else _json(expected)):
                return False
            self.capacity[name] = _json(body)
            return True

    def reopen_mailbox(self) -> None:
        self.mailbox.reopen()

    def close(self) -> None:
        self.mailbox.close()

    # -- reading ------------------------------------------------------------------------

    def position(self, projection: str, partition: int = 0) -> int:
        with self._lock:
            return self.tracking.get((projection, partition), 0)

    def positions(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self.tracking)

    def log_position(self, partition: int) -> LogPosition | None:
        with self._lock:
            return self.log_positions.get(partition)

    def log_position_later(self, partition: int) -> Callable[[], LogPosition | None]:
        return partial(self.log_position, partition)  # in memory: read when asked

    def views_position(self, projection: str) -> int:
        with self._lock:
            return min(self.tracking.get((projection, p), 0) for p in range(self.partitions))

    def conversation_key(self, aggregate_id: Any) -> tuple[str, str]:
        with self._lock:
            key = self.by_aggregate.get(str(aggregate_id))
        if key is None:
            raise LookupError(f"unknown conversation aggregate {aggregate_id}")
        return key

    def head(self, tenant: str, conversation_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self.heads_rows.get((tenant, conversation_id))
            return head_dict(row) if row is not None else None

    def sessions(self, tenant: str, user_id: str, batch: int) -> Iterator[list[SessionItem]]:
        return sessions_by_two_reads(self, tenant, user_id, batch)

    def heads(self, tenant: str, conversation_ids: Sequence[str], batch: int) -> Iterator[list[SessionHead]]:
        with self._lock:
            found = [self.heads_rows.get((tenant, c)) for c in conversation_ids]
            rows = [SessionHead(*(h[f] for f in SessionHead._fields)) for h in found if h is not None]
        rows.sort(key=lambda h: (-(h.last_activity_at or 0.0), h.conversation_id))
        for i in range(0, len(rows), batch):
            yield rows[i : i + batch]

    def first_sessions(self, tenant: str, user_id: str, batch: int) -> tuple[list[SessionItem], bool] | None:
        return None  # dicts in memory: sessions() is the quick way

    def heads_by_scope(self, tenant: str, size_bucket: str) -> list[str]:
        with self._lock:
            return [c for (t, c), h in self.heads_rows.items() if t == tenant and h["size_bucket"] == size_bucket]

    def tenants(self) -> list[str]:
        with self._lock:
            return sorted({t for t, _ in self.heads_rows})

    def conversation_activity(
        self, tenant: str | None, size_bucket: str | None = None
    ) -> Iterator[tuple[str, str, str, list[float]]]:
        with self._lock:
            rows = [
                (t, c, h["size_bucket"], [s.last_active for s in self.states.get((t, c), {}).values()])
                for (t, c), h in sorted(self.heads_rows.items())
                if (tenant is None or t == tenant) and (size_bucket is None or h["size_bucket"] == size_bucket)
            ]
        yield from rows

    def load_conversation(
        self, tenant: str, conversation_id: str
    ) -> tuple[dict[str, Any] | None, dict[str, UserConversationState], list[int]]:
        with self._lock:
            head = self.head(tenant, conversation_id)
            states = {u: copy.deepcopy(s) for u, s in self.states.get((tenant, conversation_id), {}).items()}
            msgs = self.message_rows.get((tenant, conversation_id), {})
            broadcasts = sorted(q for q, m in msgs.items() if m["mention_all"] or m["announcement"])
        return head, states, broadcasts

    def state(self, tenant: str, user_id: str, conversation_id: str) -> dict[str, Any] | None:
        with self._lock:
            s = self.states.get((tenant, conversation_id), {}).get(user_id)
            if s is None:
                return None
            return {"tenant": tenant, "user_id": user_id, "conversation_id": conversation_id, **s.row()}

    def user_states(self, tenant: str, user_id: str) -> Mapping[str, UserConversationState]:
        with self._lock:
            return {c: copy.deepcopy(s) for c, s in self.by_user.get((tenant, user_id), {}).items()}

    def message(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None:
        with self._lock:
            m = self.message_rows.get((tenant, conversation_id), {}).get(seq)
            return message_dict(m) if m is not None else None

    def messages(self, tenant: str, conversation_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            msgs = self.message_rows.get((tenant, conversation_id), {})
            return [message_dict(msgs[q]) for q in sorted(q for q in msgs if q > after_seq)[:limit]]

    def delivery(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None:
        with self._lock:
            row = self.delivery_rows.get((tenant, conversation_id, seq))
            if row is None:
                return None
            return delivery_dict({"tenant": tenant, "conversation_id": conversation_id, "conversation_seq": seq, **row})

    def mailbox_page(self, tenant: str, user_id: str, after: int, limit: int) -> list[MailboxEntry]:
        return self.mailbox.read(tenant, user_id, after, self.views_position("delivery"), limit)

    def review(self, review_id: str) -> dict[str, Any]:
        with self._lock:
            r = self.reviews_rows.get(review_id)
            if r is None:
                raise LookupError(review_id)
            return _json(r)

    def reviews(self, tenant: str) -> list[dict[str, Any]]:
        with self._lock:
            return [_json(r) for r in self.reviews_rows.values() if r["tenant"] == tenant]

    def tier(self, tier_id: str) -> dict[str, Any] | None:
        with self._lock:
            t = self.tiers.get(tier_id)
            return _json(t) if t is not None else None

    def capacity_state(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            c = self.capacity.get(name)
            return _json(c) if c is not None else None

    def capacity_states(self, names: Sequence[str]) -> list[dict[str, Any] | None]:
        return [self.capacity_state(n) for n in names]


def _json(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON body as a store of JSON text gives it back (tuples become lists, keys strings)."""
    return dict(json.loads(json.dumps(body)))
