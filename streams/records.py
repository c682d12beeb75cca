"""The Kafka record format between the relay (`streams/relay.py`) and the projection
workers (`streams/worker.py`): one topic, every event of the event store in it.

An event record:
  key     = the routing key: a conversation's aggregate id (all of its events keep their
            order in one partition), the tier id for tier and review events;
  value   = eventsourcing's stored state of the event, as the event store holds it
            (JSON from the application's transcoder);
  headers = fanout-position (the notification id in the event store's log, ASCII),
            fanout-topic (eventsourcing's topic of the event class),
            fanout-originator-id, fanout-originator-version.

A watermark record (no key, empty value, header fanout-watermark=R) is written by the
relay to EVERY partition at the end of each transaction: every event with position <= R
routed to that partition precedes it. A worker that has applied a partition up to a
watermark tracks R for it, so min over partitions of the tracked positions is a low
watermark of the whole log (docs/adr/0013-relay-and-watermarks.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from eventsourcing.persistence import StoredEvent

H_POSITION = "fanout-position"
H_TOPIC = "fanout-topic"
H_ORIGINATOR = "fanout-originator-id"
H_VERSION = "fanout-originator-version"
H_WATERMARK = "fanout-watermark"

# An event's state may be large (a bulk join of 100k members is about 1.5 MB of JSON): the
# event topic and the relay's producer accept records up to this size.
MAX_RECORD_BYTES = 32 * 1024 * 1024

Headers = Sequence[tuple[str, bytes | str | None]]


class BadRecord(ValueError):
    """A record on the event topic that neither the relay nor a test wrote."""


@dataclass(frozen=True)
class EventRecord:
    position: int
    topic: str
    originator_id: UUID
    originator_version: int
    state: bytes
    offset: int = field(default=-1, compare=False)  # in its Kafka partition, when read from Kafka

    def stored_event(self) -> StoredEvent:
        """For `app.mapper.to_domain_event`."""
        return StoredEvent(
            originator_id=self.originator_id,
            originator_version=self.originator_version,
            topic=self.topic,
            state=self.state,
        )

    def headers(self) -> list[tuple[str, bytes]]:
        return [
            (H_POSITION, str(self.position).encode()),
            (H_TOPIC, self.topic.encode()),
            (H_ORIGINATOR, str(self.originator_id).encode()),
            (H_VERSION, str(self.originator_version).encode()),
        ]


@dataclass(frozen=True)
class Watermark:
    position: int
    offset: int = field(default=-1, compare=False)  # in its Kafka partition, when read from Kafka

    def headers(self) -> list[tuple[str, bytes]]:
        return [(H_WATERMARK, str(self.position).encode())]


def _text(v: bytes | str | None) -> str:
    if v is None:
        return ""
    return v.decode() if isinstance(v, bytes | bytearray | memoryview) else str(v)


def decode(headers: Headers | None, value: bytes | None, offset: int = -1) -> EventRecord | Watermark:
    """A record as the relay wrote it (`offset`: where it was read in its partition);
    BadRecord for anything else."""
    h = {k: _text(v) for k, v in (headers or ())}
    try:
        if H_WATERMARK in h:
            return Watermark(int(h[H_WATERMARK]), offset)
        return EventRecord(
            position=int(h[H_POSITION]),
            topic=h[H_TOPIC],
            originator_id=UUID(h[H_ORIGINATOR]),
            originator_version=int(h[H_VERSION]),
            state=bytes(value or b""),
            offset=offset,
        )
    except (KeyError, ValueError) as exc:
        raise BadRecord(f"not a fanout event record (headers {sorted(h)}): {exc}") from None


def position_of(headers: Headers | None) -> int | None:
    """The log position a record carries (an event's or a watermark's), None if neither."""
    for k, v in headers or ():
        if k in (H_POSITION, H_WATERMARK):
            return int(_text(v))
    return None
