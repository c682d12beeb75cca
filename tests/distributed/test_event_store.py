"""The command side on PostgreSQL (FANOUT_EVENT_STORE=postgresql://...): several API
replicas on one database. Each replica is a FanoutApplication with `shared_store=True`;
they race for the same aggregate streams from threads, and the admission gates must stay
exact: a lost optimistic-concurrency race is retried on the fresh aggregate, never
admitted twice nor dropped. Real PostgreSQL (tests/engines.py), a fresh database per test."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from eventsourcing.application import AggregateNotFoundError

from domain.errors import FanoutError, RateLimited
from domain.params import Parameters
from domain.quota import QUOTA_SLOTS, TenantQuotaSlot
from fanout.application import FanoutApplication
from fanout.bootstrap import postgres_event_store
from fanout.clock import FakeClock

T = "acme"


@pytest.fixture
def replicas(fresh_postgres: str) -> Iterator[tuple[FakeClock, list[FanoutApplication]]]:
    clock = FakeClock()
    env = postgres_event_store(fresh_postgres)
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
        [(lambda app=apps[i % 3], s=s: app.send_message(T, "g", sender=s, text="hi")) for i, s in enumerate(senders)]
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
    # Replica 0's cached conversation is behind the MembersActive the others appended: a send
    # saves it without reading it back (ADR-0023), so that would cost one lost race here. A
    # read fast-forwards it, so the count below is about the reads and the sends only.
    apps[0].conversation(T, "g")
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

    results = race(
        [sends, *[(lambda app=apps[i % 3], u=u: app.mark_read(T, "g", u, 1)) for i, u in enumerate(readers)]]
    )
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


# -- no fast-forward read of what a command saves (ADR-0023) ------------------------------------


def sent_seqs(app: FanoutApplication, cid: str) -> list[int]:
    """The conversation_seq of every MessageSent in the store, in stream order."""
    from domain.conversation import Conversation

    out = []
    for stored in app.recorder.select_events(Conversation.create_id(T, cid)):
        event = app.mapper.to_domain_event(stored)
        if isinstance(event, Conversation.MessageSent):
            out.append(event.seq)
    return out


def charged(app: FanoutApplication, tenant: str = T) -> float:
    """Entries charged to the tenant's bucket, over its quota slots (ADR-0023)."""
    total = 0.0
    for k in range(QUOTA_SLOTS):
        with contextlib.suppress(AggregateNotFoundError):
            total += app.repository.get(TenantQuotaSlot.create_id(tenant, k)).charged_total
    return total


def test_two_replicas_alternating_sends_to_one_conversation_lose_and_duplicate_nothing(
    replicas: tuple[FakeClock, list[FanoutApplication]],
) -> None:
    """Each replica takes the conversation and the quota it saves from its cache without a
    fast-forward query, so after the other replica's send its copy is stale: the save of
    the decision made on it is refused by the version key, the command is retried on the
    fresh aggregates. Every seq exactly once, in order; the stale replica recovers."""
    clock, apps = replicas
    a, b = apps[0], apps[1]
    a.create_conversation(T, "g", "g", ["u0", "u1", "u2"])
    results = []
    for i in range(40):
        clock.advance(3.1)
        results.append((a if i % 2 == 0 else b).send_message(T, "g", sender=f"u{i % 3}", text=f"m{i}"))
    assert [r["conversation_seq"] for r in results] == list(range(1, 41))
    assert sent_seqs(a, "g") == list(range(1, 41))
    assert a.conflicts >= 15 and b.conflicts >= 15, (a.conflicts, b.conflicts)  # stale every time, recovered
    assert charged(apps[2]) == 40 * 3  # charged once per send, none lost to a stale copy

    # A refusal decided on a stale copy is decided again on a fresh one: b learns that u3
    # joined (through a) before it refuses u3's send, and that u2 left before it admits u2's.
    clock.advance(3.1)
    b.send_message(T, "g", sender="u0", text="b caches g")
    a.add_members(T, "g", ["u3"])
    a.remove_member(T, "g", "u2")
    clock.advance(3.1)
    stale = b.stale_decisions
    assert b.send_message(T, "g", sender="u3", text="joined elsewhere")["conversation_seq"] == 42
    assert b.stale_decisions == stale + 1
    clock.advance(3.1)
    with pytest.raises(FanoutError) as refused:
        b.send_message(T, "g", sender="u2", text="left elsewhere")
    assert refused.value.code == "NOT_A_MEMBER"
    assert sent_seqs(apps[2], "g") == list(range(1, 43))


def test_a_replica_sending_to_its_own_conversations_reads_nothing_back(
    replicas: tuple[FakeClock, list[FanoutApplication]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once cached, a send loads its conversation and the tenant quota with no query (they
    are saved), and the absent tier of the scope is remembered (NO_TIER_TTL): no read of
    the event store per send, only the save."""
    import fanout.tiers as tiers

    monkeypatch.setattr(tiers, "NO_TIER_TTL", 60.0)  # this test must not depend on the machine's speed
    clock, apps = replicas
    app = apps[0]
    for g in range(3):
        app.create_conversation(T, f"g{g}", "", ["u0", "u1"])
    clock.advance(3.1)
    for g in range(3):  # the first sends load the quota and look the tier up
        app.send_message(T, f"g{g}", sender="u0", text="warm")
    reads = 0
    store_get = app.repository.event_store.get

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return store_get(*args, **kwargs)

    monkeypatch.setattr(app.repository.event_store, "get", counted)
    for i in range(30):
        clock.advance(3.1)
        app.send_message(T, f"g{i % 3}", sender=f"u{i % 2}", text="hi")
    assert reads == 0
    assert app.conflicts == 0 and app.stale_decisions == 0
    # a read for validation only is still fast-forwarded: a MARK_READ sees the other replica's send
    apps[1].send_message(T, "g0", sender="u1", text="through another replica")
    seq = apps[1].conversation(T, "g0").seq
    assert app.mark_read(T, "g0", "u1", seq)["read_seq"] == seq
    assert reads > 0


def test_a_stale_absent_tier_never_takes_a_conversation_out_of_mention_only(
    replicas: tuple[FakeClock, list[FanoutApplication]],
) -> None:
    """Replica b remembers that the small scope has no tier; replica a enables one and its
    conversations enter mention_only. Within NO_TIER_TTL, b sends to such a conversation:
    it must look the tier up (a missing tier would read as a rollback), so the
    conversation stays in mention_only and the tier keeps it on its roster."""
    clock, apps = replicas
    a, b = apps[0], apps[1]
    members = [f"u{i}" for i in range(200)]
    a.create_conversation(T, "big", "", members)
    clock.advance(3.1)
    b.send_message(T, "big", sender="u0", text="b remembers: no small tier")
    assert b._no_tier  # remembered
    review = a.open_review(T, "small", "manual", {}, "ops")["review_id"]
    a.decide_review(T, review, "enable_mention_only", "ops", 1.0, 0.9)
    clock.advance(3.1)
    assert a.send_message(T, "big", sender="u2", text="a evaluates it")["write_policy"] == "mention_only"
    clock.advance(3.1)
    r = b.send_message(T, "big", sender="u1", text="through b")
    assert r["write_policy"] == "mention_only"
    tiers = {t["size_bucket"]: t for t in b.tiers(T)}
    assert tiers["small"]["state"] == "enabled" and tiers["small"]["conversations"] == ["big"]


def test_stored_events_go_in_binary_and_come_back_byte_for_byte(fresh_postgres: str) -> None:
    """ADR-0037: the recorders' insert sends its array of stored events in psycopg's binary
    format (`%b`); every byte of a state and every character of a topic comes back as written
    (the text format escapes quotes, braces, backslashes; binary escapes nothing)."""
    from uuid import uuid4

    from eventsourcing.persistence import StoredEvent

    app = FanoutApplication(
        Parameters(), dict(postgres_event_store(fresh_postgres)), clock=FakeClock(), shared_store=True
    )
    try:
        recorders = [app.recorder, app.snapshots.recorder] if app.snapshots else [app.recorder]
        for recorder in recorders:
            assert "unnest(%b::" in recorder.insert_events_statement.as_string(None)  # type: ignore[attr-defined]
        oid = uuid4()
        states = [bytes(range(256)), b"", b'{"a": "\\\\\\"}", NULL, (1,2)', b"\x00" * 3]
        topics = ["domain.x:Y", 'a "quoted", {braced} \\ topic', "ünïcode:話"]
        written = [
            StoredEvent(originator_id=oid, originator_version=v + 1, topic=topics[v % len(topics)], state=s)
            for v, s in enumerate(states)
        ]
        app.recorder.insert_events(written)
        read = app.recorder.select_events(oid)
        assert [(e.originator_version, e.topic, bytes(e.state)) for e in read] == [
            (e.originator_version, e.topic, e.state) for e in written
        ]
    finally:
        app.close()
