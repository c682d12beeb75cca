"""A log of every kind of event over a dozen conversations of two tenants, its reference
views, and the relay's shape of it (records routed to partitions, watermarks): shared by the
projection host's contract suite (tests/contract/test_projection_host.py), the worker's engine
tests (tests/distributed/test_worker.py), the pushes' and the fencing tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from adapters.memory import MemoryViews
from domain.params import Parameters
from domain.tier import Tier
from fanout.application import FanoutApplication
from fanout.clock import FakeClock
from fanout.queries import Queries
from projections.capacity import merged, state_name
from streams.embedded import EmbeddedRunner
from streams.host import ProjectionHost, Record
from streams.records import EventRecord, Watermark
from streams.routing import RoutingKeys, partition_of

PARAMS = Parameters(mailbox_shards=4)
TENANTS = ("acme", "beta")
USERS = tuple(f"u{i}" for i in range(8))
PARTITIONS = 4


# -- the log and its reference views ----------------------------------------------------------


class LogBuilder:
    """Commands on an event store, folded by the embedded runner into in-memory views
    (the reference; also what replies are resolved against)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.clock = FakeClock()
        self.views = MemoryViews()
        self.app = FanoutApplication(
            PARAMS,
            dict(env),
            clock=self.clock,
            message_sender=self._sender,
            conversations_in_scope=lambda tenant, bucket: self.views.heads_by_scope(tenant, bucket),
        )
        self.runner = EmbeddedRunner(self.app, self.views, PARAMS)

    def _sender(self, tenant: str, cid: str, seq: int) -> str | None:
        m = self.views.message(tenant, cid, seq)
        return str(m["sender"]) if m else None

    def settle(self) -> None:
        self.runner.catch_up()

    def send(self, tenant: str, cid: str, sender: str, **kw: Any) -> None:
        self.clock.advance(2.0)
        self.app.send_message(tenant, cid, sender=sender, text=f"{sender} in {cid} at {self.clock.now}", **kw)
        self.settle()

    def notes(self, start: int = 0) -> list[Any]:
        return list(self.app.recorder.select_notifications(start=start, limit=100_000, inclusive_of_start=False))

    def close(self) -> None:
        self.app.close()


def write_log(b: LogBuilder, rounds: int = 2) -> None:
    """Mentions, replies, @all, announcements, joins, a leave, MARK_READ, REBUILD over a
    dozen conversations of two tenants (spread over the partitions), and a review with
    a tier enabled and rolled back."""
    app = b.app
    for tenant in TENANTS:
        for i in range(6):
            app.create_conversation(tenant, f"c{i}", f"c{i}", list(USERS[i % 3 : i % 3 + 4]))
    b.settle()
    for r in range(rounds):
        for tenant in TENANTS:
            for i in range(6):
                cid = f"c{i}"
                members = list(USERS[i % 3 : i % 3 + 4])
                a, bb, c = members[0], members[1], members[2]
                b.send(tenant, cid, a, mentions=[bb])
                b.send(tenant, cid, bb, reply_to_seq=1 + r * 5)
                if i % 2 == 0:
                    b.send(tenant, cid, c, mention_all=True)
                else:
                    b.send(tenant, cid, c, announcement=True)
                if r == 0 and i % 3 == 0:
                    app.add_members(tenant, cid, ["u7"])
                b.send(tenant, cid, a, mentions=[bb, c])
                app.mark_read(tenant, cid, bb, 2 + r * 5)
                b.send(tenant, cid, c)
                if r == rounds - 1 and i == 1:
                    app.request_rebuild(tenant, cid, bb)
                if r == rounds - 1 and i == 2:
                    app.remove_member(tenant, cid, c)
    rid = app.open_review("acme", "small", "manual", {}, "admin")["review_id"]
    app.decide_review("acme", rid, "enable_mention_only", "admin", 1000.0, 0.5)
    app.roll_back_tier("acme", "small", "admin", "test")
    b.settle()


def snapshot(views: Any) -> dict[str, Any]:
    """Everything a client or an operator can read, with the runtime facts left out."""
    q = Queries(views, PARAMS)
    out: dict[str, Any] = {}
    for tenant in TENANTS:
        out[f"reviews/{tenant}"] = views.reviews(tenant)
        out[f"tier/{tenant}"] = views.tier(str(Tier.create_id(tenant, "small")))
        for i in range(6):
            cid = f"c{i}"
            head = views.head(tenant, cid)
            out[f"head/{tenant}/{cid}"] = head
            latest = head["latest_conversation_seq"] if head else 0
            out[f"messages/{tenant}/{cid}"] = views.messages(tenant, cid, 0, 1000)
            out[f"delivery/{tenant}/{cid}"] = [
                {
                    k: v
                    for k, v in (views.delivery(tenant, cid, s) or {}).items()
                    if k not in ("materialized_at", "online_pushes")
                }
                for s in range(1, latest + 1)
            ]
        for u in USERS:
            out[f"sessions/{tenant}/{u}"] = q.session_list(tenant, u)
            out[f"mailbox/{tenant}/{u}"] = q.mailbox(tenant, u, 0, 1000)["entries"]
    return out


def capacity_totals(views: Any, partitions: Sequence[int]) -> dict[str, Any]:
    states = [views.capacity_state(state_name(p)) or {} for p in partitions]
    st = merged(PARAMS, states).state()
    # Which triggers fire (a worker's partitions only count; the monitor keeps its own flags,
    # ADR-0020): compared as the set of firing ones.
    return {
        **{k: st[k] for k in ("slots", "entries_total", "messages_total")},
        "firing": {k for k, v in st["firing"].items() if v},
    }


def event_record(n: Any) -> EventRecord:
    return EventRecord(n.id, n.topic, n.originator_id, n.originator_version, bytes(n.state))


_KEYS: RoutingKeys | None = None


def routing_key(note: Any) -> str:
    """The relay's key of a notification (streams.routing.RoutingKeys: a member's reads go with
    their conversation), decoded with a store-less application of the same event classes."""
    global _KEYS
    if _KEYS is None:
        _KEYS = RoutingKeys(FanoutApplication(Parameters(), {"PERSISTENCE_MODULE": "eventsourcing.popo"}))
    return _KEYS.key(note)


def partitioned(notes: Sequence[Any], partitions: int = PARTITIONS) -> dict[int, list[Record]]:
    """The notes routed as the relay routes them (streams/routing.py: crc32 of the key), each
    partition ending with the top watermark. A stable hash, not hash(): str hashes change per
    process (PYTHONHASHSEED), and one run in about fourteen left a partition without any
    conversation."""
    out: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    for n in notes:
        out[partition_of(routing_key(n), partitions)].append(event_record(n))
    for p in out:
        out[p].append(Watermark(notes[-1].id))
    return out


def host_for(b: LogBuilder, views: Any, effects: list[Any] | None = None) -> ProjectionHost:
    def on_effects(es: Sequence[Any]) -> None:
        if effects is not None:
            effects.extend(es)

    return ProjectionHost(views, PARAMS, lambda r: b.app.mapper.to_domain_event(r.stored_event()), on_effects)


@contextmanager
def written_log() -> Iterator[LogBuilder]:
    """`write_log` (one round) on an in-memory event store, with its reference views."""
    b = LogBuilder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    try:
        write_log(b, rounds=1)
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def popo_log() -> Iterator[LogBuilder]:
    with written_log() as b:
        yield b
