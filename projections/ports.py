"""Ports of the read side. A projection writes through a `ViewWriter` inside one
unit of work that also records the tracking position, so each notification is
applied exactly once; every backend (SQLite here, CQL later) implements these
and passes the one contract suite in tests/contract/."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from projections.state import UserConversationState

# (user_id, pos, conversation_seq, conversation_id, flags): one UserMailboxEntry
MailboxEntry = tuple[str, int, int, str, int]


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


class MailboxStore(Protocol):
    """UserMailboxEntry, keyed (tenant, user_id, pos): the O(N) write."""

    def write(self, tenant: str, refs: MessageRefs) -> int:
        """One batch per shard; idempotent (writing the same refs again adds nothing).
        Returns the number of entries written."""

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        """Entries with after < pos <= until in pos order."""

    def count(self) -> int: ...

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        """(tenant, user_id, pos, conversation_seq, conversation_id, flags) in key order."""

    def sort_key(self, tenant: str, user_id: str, pos: int) -> Any:
        """The order all_entries() yields in, for merging two stores of one backend."""

    def flush(self) -> None:
        """Make every written entry durable."""

    def reopen(self) -> None:
        """Close and open again after a storage failure (the projector then retries)."""

    def close(self) -> None: ...


class ViewWriter(Protocol):
    """The writes of one unit of work. Every write is an idempotent upsert (or a delete),
    so applying an event twice (at-least-once delivery) changes nothing; a conversation's
    head records the position of the last event applied to it, and the projections skip
    events at or below it. Tracking is written after everything else of the unit."""

    mailbox_entries: int  # entries queued in this unit (the runner bounds a unit by it)
    partition: int  # the log partition this unit applies (embedded: 0; Kafka: the partition)

    def track(self, projection: str, position: int, partition: int = 0) -> None: ...

    def put_capacity(self, name: str, body: dict[str, Any]) -> None: ...

    def put_head(self, tenant: str, conversation_id: str, head: dict[str, Any]) -> None: ...

    def put_message(self, tenant: str, conversation_id: str, message: dict[str, Any]) -> None: ...

    def put_mailbox(self, tenant: str, refs: MessageRefs) -> None: ...

    def put_states(self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]) -> None: ...

    def put_gaps(self, tenant: str, conversation_id: str, states: Sequence[tuple[str, UserConversationState]]) -> None:
        """Update only delivered_conversation_seq, skipping and gap_end of existing rows."""

    def delete_state(self, tenant: str, conversation_id: str, user_id: str) -> None: ...

    def put_delivery(self, tenant: str, conversation_id: str, seq: int, record: dict[str, Any]) -> None: ...

    def put_review(self, review: dict[str, Any]) -> None: ...

    def put_tier(self, tier: dict[str, Any]) -> None: ...


class ViewStore(Protocol):
    def unit_of_work(self) -> AbstractContextManager[ViewWriter]:
        """Writes in the block and the tracking positions commit together or not at all."""

    def conversation_key(self, aggregate_id: Any) -> tuple[str, str]: ...

    def review(self, review_id: str) -> dict[str, Any]: ...

    def position(self, projection: str, partition: int = 0) -> int: ...

    def capacity_state(self, name: str) -> dict[str, Any] | None: ...

    # reads used by projections at start-up
    def load_conversation(
        self, tenant: str, conversation_id: str
    ) -> tuple[dict[str, Any] | None, dict[str, UserConversationState], list[int]]:
        """(head, member states, broadcast seqs)."""
