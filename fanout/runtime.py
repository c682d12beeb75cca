"""What a runtime offers the entry points (api/, cli/): the `Runtime` protocol.

The API and the CLI are typed against it and never see an engine or a projection host.
`fanout/bootstrap.py` builds the embedded runtime (SQLite event store, SQLite views,
RocksDB mailbox, the in-process runner); the distributed runtime (PostgreSQL, Kafka,
Faust, Cassandra) will implement the same protocol. Positions are event-log positions
(notification ids): what a write answers as `position`, what `min_position` waits for."""

from __future__ import annotations

from typing import Any, Protocol, Self

from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.overload import Backpressure
from fanout.push import PushHub
from fanout.queries import Queries
from projections.capacity import CapacityProjection


class Runtime(Protocol):
    params: Parameters
    app: FanoutApplication  # the commands
    queries: Queries  # the reads of the views
    hub: PushHub  # the online devices (WebSockets), pushed to after a commit (invariant O)
    backpressure: Backpressure  # refuses writes the read side cannot keep up with (ADR-0010)
    review_triggers: int  # reviews opened by T1/T2 since start

    # -- the projectors ---------------------------------------------------------

    @property
    def running(self) -> bool:
        """The projectors are following the log (False before start() and after close())."""

    @property
    def last_error(self) -> str | None:
        """The projectors' last failure while it lasts (None once an attempt succeeds)."""

    @property
    def failure_reason(self) -> str | None:
        """storage_full, storage_error or projector_failed, while last_error is set."""

    def position(self) -> int:
        """The log position the views hold."""

    def log_position(self) -> int:
        """The last position written to the event log (touches the event store)."""

    def wait_until(self, position: int, timeout: float = 30.0) -> bool:
        """Block until the views hold `position`; False at the timeout."""

    def catch_up(self) -> None:
        """Project every event written so far before returning (the demo, scripts). The
        embedded runtime does it in the calling thread when its projectors are not started."""

    def projections_status(self) -> dict[tuple[str, int], int]:
        """(projection, partition) -> the log position its views hold."""

    def capacity(self) -> CapacityProjection:
        """The live capacity window (T1/T2): rates() and firing."""

    def check(self) -> dict[str, Any]:
        """What /readyz reports beyond the projectors: each engine the runtime depends on
        (the distributed runtime: event store, relay position, workers alive, views
        position) with an `errors` map for the unreachable ones; {} in the embedded one."""

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Start the projectors; returns the runtime."""

    def close(self) -> None:
        """Stop the projectors and close every store (and release the data dir)."""
