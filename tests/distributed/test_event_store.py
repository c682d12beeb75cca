"""The command side on PostgreSQL (FANOUT_EVENT_STORE=postgresql://...): several API
replicas on one database. Each replica is a FanoutApplication with `shared_store=True`;
they race for the same aggregate streams from threads, and the admission gates must stay
exact: a lost optimistic-concurrency race is retried on the fresh aggregate, never
admitted twice nor dropped. Real PostgreSQL (tests/engines.py), a fresh database per test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from domain.errors import FanoutError, RateLimited
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.clock import FakeClock
from fanout.urls import postgres_env

T = "acme"


@pytest.fixture
def replicas(fresh_postgres: str) -> Iterator[tuple[FakeClock, list[FanoutApplication]]]:
    clock = FakeClock()
    env = postgres_env(fresh_postgres)
    apps = [FanoutApplication(Parameters(), dict(env), clock=clock, shared_store=True) for _ in range(3)]
    try:
        yield clock, apps
    finally:
        for app in apps:
            app.close()


def race(calls: list[Any]) -> list[Any]:
    """Run the calls at once from threads; each result or the FanoutError it raised."""
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = calls[i]()
        except FanoutError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_the_conversation_rate_is_exact_across_replicas(replicas: tuple[FakeClock, list[FanoutApplication]]) -> None:
    clock, apps = replicas
    senders = [f"u{i}" for i in range(30)]
    apps[0].create_conversation(T, "g", "g", senders)
    clock.advance(10)
    # 30 different senders in one instant through three replicas: the small-group rate admits
    # exactly its burst (20 msg/s), whichever replica each send reached.
    results = race(
        [
            (lambda app=apps[i % 3], s=s: app.send_message(T, "g", sender=s, text="hi"))
            for i, s in enumerate(senders)
        ]
    )
    accepted = [r for r in results if isinstance(r, dict)]
    refused = [r for r in results if isinstance(r, RateLimited)]
    assert len(accepted) == Parameters().rate_small, results
    assert len(accepted) + len(refused) == len(senders), results
    seqs = sorted(r["conversation_seq"] for r in accepted)
    assert seqs == list(range(1, len(accepted) + 1))  # no seq given twice, none skipped
    assert sum(app.conflicts for app in apps) > 0  # the replicas really raced


def test_one_sender_is_admitted_once_per_interval_across_replicas(
    replicas: tuple[FakeClock, list[FanoutApplication]],
) -> None:
    clock, apps = replicas
    apps[1].create_conversation(T, "g", "g", ["a", "b"])
    clock.advance(10)
    results = race([(lambda app=app: app.send_message(T, "g", sender="a", text="x")) for app in apps * 2])
    assert sum(isinstance(r, dict) for r in results) == 1, results
    assert all(isinstance(r, dict | RateLimited) for r in results), results


def test_a_replica_sees_what_another_wrote(replicas: tuple[FakeClock, list[FanoutApplication]]) -> None:
    clock, apps = replicas
    apps[0].create_conversation(T, "g", "g", ["a"])
    apps[1].add_members(T, "g", ["b", "c"])  # loads the conversation into replica 1's cache
    apps[0].add_members(T, "g", ["d"])
    clock.advance(5)
    r = apps[1].send_message(T, "g", sender="d", text="seen")  # replica 1 must know d joined
    assert r["conversation_seq"] == 1
    assert apps[2].conversation(T, "g").members.keys() >= {"a", "b", "c", "d"}
    assert apps[0].log_position() == apps[2].log_position() > 0


def conversation_version(app: FanoutApplication, cid: str) -> int:
    from domain.conversation import Conversation

    return max(e.originator_version for e in app.recorder.select_events(Conversation.create_id(T, cid)))


def test_members_reading_through_three_replicas_do_not_touch_the_conversation_stream(
    replicas: tuple[FakeClock, list[FanoutApplication]],
) -> None:
    """ADR-0018: a MARK_READ appends to the member's own stream. Many members reading at
    once through three replicas, while sends are admitted on the same conversation: not
    one conversation-stream conflict, the gate admits exactly its burst, every read lands."""
    clock, apps = replicas
    readers = [f"r{i}" for i in range(120)]
    senders = [f"s{i}" for i in range(30)]
    apps[0].create_conversation(T, "g", "g", readers + senders)
    clock.advance(10)
    apps[0].send_message(T, "g", sender="s0", text="first")
    # 1. Every reader is silent: its activity is recorded, group-committed per replica.
    results = race([(lambda app=apps[i % 3], u=u: app.mark_read(T, "g", u, 1)) for i, u in enumerate(readers)])
    assert all(isinstance(r, dict) and r["coalesced"] is False for r in results), results
    for app in apps:
        app.flush_activity()
    activity = sum(app.activity_events for app in apps)
    assert 1 <= activity <= 30, activity  # a few MembersActive for 120 stale readers, not 120
    members = apps[1].conversation(T, "g").members
    assert all(members[u] > 0.0 for u in readers)  # every reader is active (alpha, mention_only)
    # 2. Activity is fresh now: 120 reads through three replicas race 29 sends on one.
    clock.advance(5)
    conflicts = sum(app.conflicts for app in apps)
    version = conversation_version(apps[0], "g")

    def sends() -> list[Any]:
        out: list[Any] = []
        for s in senders[1:]:
            try:
                out.append(apps[0].send_message(T, "g", sender=s, text="hi"))
            except RateLimited as exc:
                out.append(exc)
        return out

    results = race([sends, *[(lambda app=apps[i % 3], u=u: app.mark_read(T, "g", u, 1)) for i, u in enumerate(readers)]])
    sent, reads = results[0], results[1:]
    assert all(isinstance(r, dict) and r["coalesced"] is False for r in reads), reads  # views: none here
    accepted = [r for r in sent if isinstance(r, dict)]
    assert len(accepted) == Parameters().rate_small, sent  # exactly the burst (refilled since "first")
    assert sorted(r["conversation_seq"] for r in accepted) == list(range(2, len(accepted) + 2))
    assert sum(app.conflicts for app in apps) == conflicts  # not one race lost
    assert conversation_version(apps[0], "g") == version + len(accepted)  # the sends only
    assert all(app.pending_activity() == 0 for app in apps)
    # 3. Reads that move forward append to the members' streams only.
    from domain.reads import MemberReadState

    seq = len(accepted) + 1
    results = race([(lambda app=apps[i % 3], u=u: app.mark_read(T, "g", u, seq)) for i, u in enumerate(readers)])
    assert all(isinstance(r, dict) for r in results), results
    assert conversation_version(apps[0], "g") == version + len(accepted)
    assert sum(app.conflicts for app in apps) == conflicts
    for u in readers[:5]:
        stream = list(apps[2].recorder.select_events(MemberReadState.create_id(T, "g", u)))
        assert len(stream) == 2  # Created (read 1), ReadMarked (read seq)
