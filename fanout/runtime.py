"""What a runtime offers the entry points (api/, cli/): the `Runtime` protocol.

The API and the CLI are typed against it and never see an engine or a projection host.
The composition root (`fanout/bootstrap/`) builds the embedded runtime (`fanout/embedded.py`:
SQLite event store, SQLite views, RocksDB mailbox, the in-process host) or an API replica of
the distributed one (`fanout/distributed.py`: PostgreSQL, Kafka, Cassandra); both implement it. Positions are event-log positions
(notification ids): what a write answers as `position`, what `min_position` waits for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, Self

from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.clock_guard import ClockGuard
from fanout.overload import Backpressure
from fanout.push import PushHub
from fanout.queries import Queries
from projections.capacity import CapacityProjection
from projections.head_cache import HeadCache
from projections.ports import ViewStore


class Runtime(Protocol):
    params: Parameters
    app: FanoutApplication  # the commands
    queries: Queries  # the reads of the views
    hub: PushHub  # the online devices (WebSockets), pushed to after a commit (invariant O)
    backpressure: Backpressure  # refuses writes the read side cannot keep up with (ADR-0010)
    views: ViewStore  # the views the queries read (the re-review watch keeps its memo there)
    head_cache: HeadCache | None  # the heads kept for logins (an API replica of the distributed runtime, ADR-0035)
    clock_guard: ClockGuard | None  # this replica's clock held to the event store's (distributed, ADR-0041)

    @property
    def review_triggers(self) -> int:
        """Reviews this process's capacity triggers opened (T1/T2) since start."""

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

    def position(self, partition: int | None = None) -> int:
        """The log position the views hold: every event up to it is applied. With a
        `partition` (of `conversation_partition`): every event up to it routed to that
        partition is applied (at least `position()`)."""

    def log_position(self) -> int:
        """The last position written to the event log (touches the event store)."""

    def wait_until(self, position: int, timeout: float = 30.0, partition: int | None = None) -> bool:
        """Block until the views hold `position` (of that `partition` only, when given);
        False at the timeout."""

    def conversation_partition(self, tenant: str, conversation_id: str) -> int | None:
        """The log partition of the events every view of this one conversation is built from
        (its head, messages, delivery records, its members' read states): a read of it needs
        only that partition to hold a position. None when the log is not partitioned (the
        embedded runtime) or the id is not a valid one: then the whole log counts."""

    def catch_up(self) -> None:
        """Project every event written so far before returning (the demo, scripts). The
        embedded runtime does it in the calling thread when its projectors are not started."""

    def projections_status(self) -> dict[tuple[str, int], int]:
        """(projection, partition) -> the log position its views hold."""

    def host_counters(self) -> dict[str, dict[str, int]]:
        """Projection host -> its running totals: units, failures, fenced (units stopped
        because another writer had moved the partition past them), heals (views found
        behind what the host had committed), reread (records read again from the log).
        The distributed runtime: each live worker's, from its heartbeats; the embedded
        runtime has one writer in its own process and reports none."""

    def capacity(self) -> CapacityProjection:
        """The live capacity window (T1/T2): rates() and firing."""

    def mailbox_cost(self) -> tuple[float | None, int]:
        """(seconds the mailbox store's writes took, entries they wrote) since start: the
        mailbox layer's unit cost of re-review condition 4 (ADR-0026); None when this
        process neither writes the mailbox nor hears from the writers."""

    def check(self) -> dict[str, Any]:
        """What /readyz reports beyond the projectors: each engine the runtime depends on
        (the distributed runtime: event store, relay position, workers alive, views
        position) with an `errors` map for the unreachable ones; {} in the embedded one."""

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Start the projectors; returns the runtime."""

    def close(self) -> None:
        """Stop the projectors and close every store (and release the data dir)."""


class ViewReads:
    """What the command side reads from the views, the same in both runtimes (handed to
    `FanoutApplication` as its message_sender, conversations_in_scope and read_state by the
    composition root).

    `position()`: the position the views hold; `catch_up()`: wait until they hold the log
    written so far (before a tier decision lists the conversations of its scope)."""

    def __init__(self, views: ViewStore, position: Callable[[], int], catch_up: Callable[[], None]) -> None:
        self.views = views
        self.position = position
        self.catch_up = catch_up

    def message_sender(self, tenant: str, conversation_id: str, seq: int) -> str | None:
        """Who sent the message a reply points at, as the views hold it (None when they have
        not applied it: the application then reads its MessageSent from the event store)."""
        m = self.views.message(tenant, conversation_id, seq)
        return str(m["sender"]) if m is not None else None

    def conversations_in_scope(self, tenant: str, size_bucket: str) -> list[str]:
        self.catch_up()
        return self.views.heads_by_scope(tenant, size_bucket)

    def read_state(self, tenant: str, conversation_id: str, user_id: str) -> tuple[int, int] | None:
        """(read_seq, views position) of a member: the position is read after the state,
        so the views at that position hold at least that read seq."""
        state = self.views.state(tenant, user_id, conversation_id)
        return None if state is None else (int(state["read_conversation_seq"]), self.position())

    def wiring(self) -> dict[str, Any]:
        """The keyword arguments of FanoutApplication these reads fill."""
        return {
            "message_sender": self.message_sender,
            "conversations_in_scope": self.conversations_in_scope,
            "read_state": self.read_state,
        }
