"""The projection workers' heartbeats (docs/adr/0019-worker-heartbeats.md).

Each worker publishes a `WorkerBeat` once a second from its event loop (a Faust timer: a
loop that is stuck stops beating), with the partitions of the event topic it holds, on the
pushes topic (streams/pushes.py carries it: `PushPublisher.beat`, `PushSubscriber(on_beat=)`).
A replica counts the workers whose beats reach it (`WorkerBeats`) for /readyz and /metrics.
An earlier design asked Kafka's group coordinator (AdminClient.describe_consumer_groups)
every 2 s; an admin request in flight while the broker restarted aborted the whole replica
inside librdkafka (`rd_kafka_enq_once_del_source_return` assertion, rdkafka_admin.c
"coordinator request").

A beat's record is JSON, kind "beat", in the format of every record of the pushes topic
(`FORMAT`, its "v" field)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

FORMAT = 1  # the "v" field of every record of the pushes topic: pushes, beats, tracked positions
BEAT_INTERVAL = 1.0  # seconds between a worker's heartbeats
BEAT_KIND = "beat"  # the "kind" field of a beat's record


@dataclass(frozen=True)
class WorkerBeat:
    """A projection worker saying it is alive: which partitions of the event topic it holds
    now, and when it will beat again at the latest. `leaving`: its last beat, on shutdown."""

    worker: str  # host:pid:random, unique per process
    partitions: tuple[int, ...]
    at: float  # the worker's wall clock
    interval: float = BEAT_INTERVAL
    leaving: bool = False
    # the worker's running totals since it started (HostStats: units, failures, fenced, heals,
    # reread), shown by the replicas' /metrics per worker
    counters: Mapping[str, int] = field(default_factory=dict, compare=False)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def encode_beat(b: WorkerBeat) -> bytes:
    body = {
        "v": FORMAT,
        "kind": BEAT_KIND,
        "worker": b.worker,
        "partitions": list(b.partitions),
        "at": b.at,
        "interval": b.interval,
        "leaving": b.leaving,
        "counters": dict(b.counters),
    }
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def decode_beat(body: Mapping[str, Any]) -> WorkerBeat:
    """The beat of a decoded record of kind "beat" (its format checked by the caller,
    streams/push_records.py `decode`); KeyError, TypeError or ValueError when a field is wrong."""
    return WorkerBeat(
        worker=str(body["worker"]),
        partitions=tuple(int(p) for p in body["partitions"]),
        at=float(body["at"]),
        interval=float(body["interval"]),
        leaving=bool(body["leaving"]),
        counters={str(k): int(v) for k, v in body.get("counters", {}).items()},
    )


class WorkerBeats:
    """The workers whose heartbeats reached this replica lately. A worker counts as alive
    until `misses` of its intervals pass without a beat (a kill -9 sends no last beat), or
    until its leaving beat. Thread-safe: the subscriber's thread writes, any thread reads."""

    def __init__(self, *, misses: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.misses = misses
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, WorkerBeat]] = {}  # worker -> (received, beat)

    def seen(self, beat: WorkerBeat, age: float = 0.0) -> None:
        """A beat received now; `age`: seconds it had already waited in the topic (a beat
        read back at start)."""
        with self._lock:
            if beat.leaving:
                self._last.pop(beat.worker, None)
            else:
                self._last[beat.worker] = (self.clock() - max(0.0, age), beat)

    def alive(self) -> list[WorkerBeat]:
        now = self.clock()
        with self._lock:
            for w, (received, b) in list(self._last.items()):
                if now - received > self.misses * b.interval:
                    del self._last[w]
            return [b for _, b in self._last.values()]

    def count(self) -> int:
        return len(self.alive())

    def partitions(self) -> set[int]:
        """The event topic's partitions some live worker holds."""
        return {p for b in self.alive() for p in b.partitions}

    def counters(self) -> dict[str, dict[str, int]]:
        """worker -> the counters of its last beat, for the live workers."""
        return {b.worker: dict(b.counters) for b in self.alive()}
