"""Ports of the read side. A projection writes through a `ViewWriter` inside one
unit of work that also records the tracking position, so each notification is
applied exactly once; everything that reads the views (the runner, the projections,
`Queries`, the push hub, the tools) reads through a `ViewReader`. Every backend
(SQLite + RocksDB, Cassandra, and the in-memory one) implements these and passes the one
contract suite per port in tests/contract/.

No read needs a join: the login read is the user's state rows (one partition by
tenant + user) and one batched read of those conversations' heads, combined by the
query side (fanout/queries.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from projections.rows import DeliveryRecord, MessageRow
from projections.state import SessionHead as SessionHead  # the login's head record, beside session_item
from projections.state import SessionItem as SessionItem
from projections.state import UserConversationState

# (user_id, pos, conversation_seq, conversation_id, flags): one UserMailboxEntry
MailboxEntry = tuple[str, int, int, str, int]

# The targets of the views a unit of work writes (a rebuild restricts it to some):
# the mailbox store, the member states, and the rest (heads, messages, delivery
# records, reviews, tiers).
ALL_TARGETS = frozenset({"mailbox", "state", "heads"})


class StoreLayoutError(RuntimeError):
    """A store written in a layout this build does not read (e.g. a Cassandra mailbox keyed by
    member, before ADR-0038): its message says what to do. Never opened as if empty."""


@dataclass(frozen=True)
class MessageRefs:
    """The mailbox references of one message: every user in `shards` gets an entry
    with `flags`, except users in `special` (sender, mentioned, replied-to; always
    recipients too), who get their own flags. Grouped per MailboxShard."""

    conversation_id: str
    pos: int
    seq: int
    flags: int
    special: dict[str, int]
    shards: dict[int, list[str]]
    # shard -> version of that member list (bumped on join/leave), when the lists are the
    # conversation's standing member lists: a store may cache what it derives from them.
    versions: dict[int, int] | None = None
    at: float = 0.0  # when the message was accepted (the event's time): a store may key by it


class LogPosition(NamedTuple):
    """Where one log partition's views stand: the position of the last unit committed and
    the log's next offset to read after it (-1 when the host does not know offsets). The
    fencing check and the heal after lost writes read it (streams/host.py)."""

    position: int
    next_offset: int


class MailboxStore(Protocol):
    """UserMailboxEntry, keyed (tenant, user_id, pos): the O(N) write."""

    def write(self, tenant: str, refs: MessageRefs) -> int:
        """One batch per shard; idempotent (writing the same refs again adds nothing).
        Returns the number of entries written."""

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        """Entries with after < pos <= until in pos order."""

    def count(self) -> int: ...

    def written(self) -> int | None:
        """The highest message position a write held, recorded atomically with each write's
        entries (None: nothing written, or a store that does not record it). A store that
        keeps a prefix of its writes after a power loss says how far that prefix reaches:
        the embedded runtime compares it with its views at start (ADR-0056)."""

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        """(tenant, user_id, pos, conversation_seq, conversation_id, flags) in key order."""

    def sort_key(self, tenant: str, user_id: str, pos: int) -> Any:
        """The order all_entries() yields in, for merging two stores of one backend."""

    def flush(self) -> None:
        """Make every written entry durable."""

    def reopen(self) -> None:
        """Close and open again after a storage failure (the projector then retries)."""

    def close(self) -> None: ...


class MailboxTimer(Protocol):
    """How long the mailbox layer takes to write (re-review condition 4, ADR-0026). A view
    store given one (its constructor's `timer`, from the composition root) reports each write
    of a unit's mailbox entries: a write to its mailbox store, or the round its entries ride
    (Cassandra's round A); the totals are what the timer counted of them."""

    seconds: float  # in the writes counted
    entries: int  # that they wrote

    def observe(self, seconds: float, entries: int, largest: int) -> None:
        """A write of `entries` entries, `largest` of them one message's, took `seconds`."""


def timed_write(mailbox: MailboxStore, tenant: str, refs: MessageRefs, timer: MailboxTimer | None) -> int:
    """`mailbox.write(tenant, refs)`, its time told to `timer` (one message's entries)."""
    started = time.perf_counter()
    n = mailbox.write(tenant, refs)
    if timer is not None:
        timer.observe(time.perf_counter() - started, n, n)
    return n


class ViewWriter(Protocol):
    """The writes of one unit of work. Every write is an idempotent upsert (or a delete),
    so applying an event twice (at-least-once delivery) changes nothing; a conversation's
    head records the position of the last event applied to it, and the projections skip
    events at or below it. Tracking is written after everything else of the unit."""

    mailbox_entries: int  # entries queued in this unit (the runner bounds a unit by it)
    partition: int  # the log partition the writes come from now (`applying`; embedded: 0)

    def applying(self, partition: int, above: int) -> None:
        """The writes that follow come from events of log `partition` (until the next call;
        before any, partition 0 above 0), every one above position `above` (the lowest its
        views tracked there before the unit). A store may keep `above` as a lower bound of
        what a write derives from (Cassandra's mailbox floors, ADR-0045)."""

    def track(self, projection: str, position: int, partition: int = 0) -> None: ...

    def track_log(self, partition: int, position: int, next_offset: int) -> None:
        """Where this unit leaves the log partition (its LogPosition), written with the tracking."""

    def put_capacity(self, name: str, body: dict[str, Any]) -> None: ...

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, Any], *, lookups: bool = True) -> None:
        """The conversation's head. `lookups` False: what a head is found by (its aggregate
        id, its tenant and size bucket) is as the views already hold it (ADR-0049); a store
        keeping lookup rows apart from the head (Cassandra) need not write them again."""

    def heads_written(self) -> Iterable[tuple[str, str]]:
        """(tenant, conversation_id) of every head this unit put (its ViewsTracked names them)."""

    def put_message(self, tenant: str, conversation_id: str, message: MessageRow) -> None: ...

    def put_mailbox(self, tenant: str, refs: MessageRefs) -> None: ...

    def put_states(
        self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]
    ) -> None: ...

    def put_gaps(self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]) -> None:
        """Update only delivered_conversation_seq, skipping and gap_end of existing rows.
        `states` are the members' whole current states (the projection's working set): a
        store that keeps a login's copy of a state writes it whole from them (ADR-0043)."""

    def delete_state(self, tenant: str, conversation_id: str, user_id: str) -> None: ...

    def put_activity(
        self, tenant: str, conversation_id: str, user_ids: Sequence[str], bucket: int, previous: int | None
    ) -> None:
        """The login index (ADR-0028): these members' row of the conversation moves to
        activity `bucket` (from `previous`, deleted, when given and different); a store
        whose login read needs no index (SQLite joins, memory) ignores it."""

    def delete_activity(self, tenant: str, conversation_id: str, user_id: str, bucket: int) -> None:
        """The login index row of a member who left (ignored where put_activity is)."""

    def put_delivery(self, tenant: str, conversation_id: str, seq: int, record: DeliveryRecord) -> None: ...

    def put_review(self, review: dict[str, Any]) -> None: ...

    def put_tier(self, tier: dict[str, Any]) -> None: ...


class ViewReader(Protocol):
    """Every read of the views. Rows are plain dicts (the write's keys, `tenant` too
    for heads); None or LookupError says a row is absent, as each method states."""

    # -- tracking ----------------------------------------------------------------

    def position(self, projection: str, partition: int = 0) -> int:
        """The last position applied for (projection, partition); 0 before any."""

    def positions(self) -> dict[tuple[str, int], int]:
        """(projection, partition) -> the last position applied, for every one tracked."""

    def log_position(self, partition: int) -> LogPosition | None:
        """The LogPosition the last unit of this partition wrote; None before any."""

    def log_position_later(self, partition: int) -> Callable[[], LogPosition | None]:
        """log_position(partition) read ahead: the read may start now (a request in flight
        while the caller folds) and is answered by calling the result, which reads no older
        state than a log_position call made now would."""

    def views_position(self, projection: str) -> int:
        """The position every partition of the log has applied for this projection: the
        minimum of position(projection, p) over partitions 0..partitions-1 (a partition
        never tracked counts 0). One partition: position(projection, 0)."""

    # -- conversations -------------------------------------------------------------

    def conversation_key(self, aggregate_id: Any) -> tuple[str, str]:
        """(tenant, conversation_id) of a Conversation aggregate; LookupError if unknown."""

    def head(self, tenant: str, conversation_id: str) -> dict[str, Any] | None: ...

    def heads(self, tenant: str, conversation_ids: Sequence[str], batch: int) -> Iterator[list[SessionHead]]:
        """The heads of these conversations (the absent skipped), most recent activity
        first (then by conversation id), in lists of at most `batch`: one batched read
        (a multi-partition read in CQL), produced lazily."""

    def sessions(self, tenant: str, user_id: str, batch: int) -> Iterator[list[SessionItem]]:
        """The login read (ADR section 3): each conversation of the user with its head,
        most recent activity first (then by conversation id), in lists of at most
        `batch`, produced lazily; never a read per conversation. A store without joins
        answers it with `projections.state.sessions_by_two_reads` (its states, then one
        batched read of their heads); SQLite answers it with one statement."""

    def first_sessions(self, tenant: str, user_id: str, batch: int) -> tuple[list[SessionItem], bool] | None:
        """The login's first list the quick way, when the store has one (Cassandra's login
        index, ADR-0028): at least `batch` of the user's sessions in `sessions()` order,
        exactly the first ones of it, and whether they are all of them; None when it has no
        quicker way than `sessions()` (SQLite, memory) or cannot vouch for this user."""

    def heads_by_scope(self, tenant: str, size_bucket: str) -> list[str]:
        """The conversation ids of the tenant whose head is in this size bucket."""

    def tenants(self) -> list[str]:
        """Every tenant with a conversation, sorted."""

    def conversation_activity(
        self, tenant: str | None, size_bucket: str | None = None
    ) -> Iterator[tuple[str, str, str, list[float]]]:
        """(tenant, conversation_id, size_bucket, the members' last_active) of every
        conversation (of one tenant, or all; of one size bucket, or all), in (tenant,
        conversation_id) order. A member state read a conversation: the re-review watch asks
        for the large bucket alone, which it reads every few seconds."""

    def load_conversation(
        self, tenant: str, conversation_id: str
    ) -> tuple[dict[str, Any] | None, dict[str, UserConversationState], list[int]]:
        """(head, member states, broadcast seqs): a projection's working set."""

    # -- members -------------------------------------------------------------------

    def state(self, tenant: str, user_id: str, conversation_id: str) -> dict[str, Any] | None:
        """One UserConversationState row as a dict (its fields plus conversation_id)."""

    def user_states(self, tenant: str, user_id: str) -> Mapping[str, UserConversationState]:
        """conversation_id -> the user's state, for every conversation the user is in:
        one partition (tenant, user)."""

    # -- messages and delivery records ---------------------------------------------

    def message(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None: ...

    def messages(self, tenant: str, conversation_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """Messages with conversation_seq > after_seq in seq order, at most `limit`."""

    def delivery(self, tenant: str, conversation_id: str, seq: int) -> dict[str, Any] | None:
        """The cost record, with the runtime facts materialized_at and online_pushes."""

    def mailbox_page(self, tenant: str, user_id: str, after: int, limit: int) -> list[MailboxEntry]:
        """Mailbox entries after `after` up to views_position("delivery"): the position
        every partition has committed, so a cursor never skips an entry whose views have
        not committed yet, even when partitions commit in different orders on different
        workers."""

    # -- admin views ---------------------------------------------------------------

    def review(self, review_id: str) -> dict[str, Any]:
        """LookupError if unknown."""

    def reviews(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's reviews, the one written last at the end."""

    def tier(self, tier_id: str) -> dict[str, Any] | None: ...

    def capacity_state(self, name: str) -> dict[str, Any] | None: ...

    def capacity_states(self, names: Sequence[str]) -> list[dict[str, Any] | None]:
        """capacity_state of each name, in order (the reads may run at once)."""


class ViewStore(ViewReader, Protocol):
    """The views a projection host owns: the reads, the units of work, the mailbox."""

    mailbox: MailboxStore
    # A unit's member states, rows, heads and tracking commit in one transaction (only the
    # idempotent mailbox entries may land ahead of them): SQLite and memory. Cassandra commits
    # in rounds, and the host then keeps a reshaping event alone in its conversation's unit
    # (streams/host.py ALONE, ADR-0025, ADR-0029).
    atomic_units: bool

    def unit_of_work(
        self,
        targets: frozenset[str] = ALL_TARGETS,
        *,
        now: float | None = None,
        checkpoint: Callable[[str], None] | None = None,
    ) -> AbstractContextManager[ViewWriter]:
        """Writes in the block and the tracking positions commit together or not at all.
        Only the writes of `targets` are kept; `now` stamps materialized_at. `checkpoint` is
        called with the next step's name between the steps of the commit (the host's fencing
        check raises there to end a stale unit; the crash tests kill there): a store that
        commits in rounds (Cassandra) calls it between them, one that commits in a transaction
        before its mailbox writes and its commit (SQLite), the memory store never."""

    def record_pushes(self, tenant: str, conversation_id: str, seq: int, pushes: int) -> None:
        """Add online pushes to a delivery record (after its unit committed)."""

    def compare_and_put_capacity(self, name: str, expected: dict[str, Any] | None, body: dict[str, Any]) -> bool:
        """Write a capacity body only if the stored one is still `expected` (None: absent);
        False, nothing written, when another writer changed it first (the T1/T2 monitor's
        memo: a stale monitor never rewinds it)."""

    def reopen_mailbox(self) -> None:
        """After a storage failure: the projector retries on a freshly opened mailbox."""

    def close(self) -> None: ...


class StaleAside(RuntimeError):
    """The live views moved while a rebuild built aside: nothing was swapped."""


@dataclass
class StoreDiff:
    """Two view stores compared table by table (runtime facts left out)."""

    positions: tuple[int, int]  # the delivery positions tracked (live, rebuilt)
    rows: dict[str, int]  # table -> rows in the live views
    # table -> (only in the live views, only in the rebuilt views), first `limit` rows each
    differences: dict[str, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]] = field(default_factory=dict)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Swapped:
    """What a swap did to one live table."""

    rows: int  # rows in the live table after the swap
    upserted: int | None = None  # rows written into it (None: the whole table was replaced)
    deleted: int | None = None  # rows deleted from it (None: the whole table was replaced)


AsideProgress = Callable[[str, int], None]  # (table, rows read so far)


class AsideBuilds(Protocol):
    """The engine's side of `fanout rebuild` / `verify`: views built aside from the log under
    a NAME, compared with the live views or swapped into them. The engine decides where a
    name lives (SQLite + RocksDB: files with a prefix beside the live ones; Cassandra: a
    keyspace beside the live one), so one rebuild and one verify (tools/rebuild.py) serve
    every engine. A name is lower-case letters, digits and `_` (both engines accept it).
    Nothing else writes the live views while a swap runs (the tool holds the data dir's
    lock, or finds no worker in the consumer group)."""

    tables: tuple[str, ...]  # every table verify compares (the mailbox included)

    def tables_of(self, targets: frozenset[str]) -> list[str]:
        """The tables a rebuild of `targets` replaces (the mailbox too when it is a target)."""

    def open(self, name: str) -> ViewStore:
        """Fresh, empty views under `name` for the projection host to build into (whatever
        a crashed run left under that name is removed first); the caller closes them."""

    def remove(self, name: str) -> None:
        """Delete the views built aside under `name` (nothing if there are none); never the live ones."""

    def positions(self, name: str | None = None) -> dict[tuple[str, int], int]:
        """(projection, log partition) -> the position tracked in the views built aside
        under `name`, or in the live views (None)."""

    def diff(self, name: str, limit: int, progress: AsideProgress | None = None) -> StoreDiff:
        """The live views compared with the views built aside under `name`, table by table
        (the mailbox included, runtime facts left out); at most `limit` rows shown per side."""

    def swap(
        self, name: str, targets: frozenset[str], expect: dict[tuple[str, int], int],
        progress: AsideProgress | None = None,
    ) -> dict[str, Swapped]:  # fmt: skip
        """Put the tables of `targets` built aside under `name` in place of the live ones;
        the runtime facts of live delivery records are carried over. StaleAside, nothing
        swapped, if the live positions are not `expect` (the views moved since the build)."""

    def close(self) -> None:
        """Release what the port opened itself (the live views are the caller's)."""
