"""The event store's notification log as the projection host reads it (the `EventLog` the
embedded runner and the rebuild pull from; a worker's Kafka take is the other kind of log).

One log, one partition (0): notification ids are the positions, and there are no Kafka
offsets (-1). A take of fewer than `limit` events has read every notification up to the
log's top, so it ends with a `Watermark` of that top: the host then tracks it, past the
notifications no projection folds (quota charges) that the select left out."""

from __future__ import annotations

from typing import Any, Protocol, cast
from uuid import UUID

from streams.records import EventRecord, Watermark

Record = EventRecord | Watermark


class EventLog(Protocol):
    """A log the host pulls from, one partition (0)."""

    def top(self) -> int:
        """The position of the last event in the log (0: empty)."""

    def take(self, after: int, limit: int) -> list[Record]:
        """Up to `limit` event records after position `after` (of the topics the log was
        opened for), then a Watermark of the top when they are all there is."""

    def to_domain_event(self, record: EventRecord) -> Any: ...


class NotificationLog:
    """An eventsourcing application's notification log (SQLite or PostgreSQL), optionally
    ending at `until` (a rebuild projects positions 1..until while the live log moves on)."""

    def __init__(self, app: Any, topics: list[str] | tuple[str, ...], *, until: int | None = None) -> None:
        self.app = app
        self.topics = list(topics)
        self.until = until

    def top(self) -> int:
        if self.until is not None:
            return self.until
        return int(self.app.recorder.max_notification_id() or 0)

    def take(self, after: int, limit: int) -> list[Record]:
        top = self.top()
        if top <= after:
            return []
        notes = self.app.recorder.select_notifications(
            start=after, limit=limit, stop=top, topics=self.topics, inclusive_of_start=False
        )
        records: list[Record] = [
            EventRecord(n.id, n.topic, cast(UUID, n.originator_id), n.originator_version, n.state) for n in notes
        ]
        if len(notes) < limit:
            records.append(Watermark(top))
        return records

    def to_domain_event(self, record: EventRecord) -> Any:
        return self.app.mapper.to_domain_event(record.stored_event())
