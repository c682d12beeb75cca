"""Group commit (ADR-0030) on the shared PostgreSQL event store, with replicas racing: two
API replicas each send groups of sends to the SAME conversations from their own threads, so
groups lose races on a conversation's version (the whole transaction fails and its sends run
again alone) and on the tenant's quota slots. Whatever the interleaving: every accepted send
is in the log exactly once, at or before the position its answer gave, each conversation's seqs are
1..n without a gap or a repeat, and no send is refused for contention."""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from domain.conversation import Conversation
from domain.params import Parameters, Rate
from fanout.application import FanoutApplication
from fanout.bootstrap import postgres_event_store

T = "acme"
CONVERSATIONS = [f"c{i}" for i in range(4)]
MEMBERS = [f"m{i}" for i in range(10)]
ROUNDS, GROUP = 15, 8


@pytest.fixture
def env(fresh_postgres: str) -> Iterator[dict[str, str]]:
    yield postgres_event_store(fresh_postgres)


def test_replicas_sending_groups_to_the_same_conversations_lose_and_double_nothing(env: dict[str, str]) -> None:
    params = dataclasses.replace(Parameters(), rate_small=1e6, per_sender_in_conversation_rate=Rate(1e6, 1.0))
    setup = FanoutApplication(params, dict(env), shared_store=True, replica_id="setup")
    for cid in CONVERSATIONS:
        setup.create_conversation(T, cid, cid, MEMBERS)
    replicas = [FanoutApplication(params, dict(env), shared_store=True, replica_id=f"r{i}") for i in range(2)]
    results: list[list[tuple[Any, BaseException | None]]] = [[] for _ in replicas]
    start = threading.Barrier(len(replicas))

    def run(i: int) -> None:
        app, rng = replicas[i], random.Random(i)
        start.wait()
        for r in range(ROUNDS):
            calls = [
                partial(
                    app.send_message, T, rng.choice(CONVERSATIONS), sender=rng.choice(MEMBERS), text=f"r{i} round {r}"
                )
                for _ in range(GROUP)
            ]
            results[i].extend(app.grouped(calls))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(replicas))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        refused = [exc for out in results for _, exc in out if exc is not None]
        assert refused == []
        accepted = {res["message_id"]: res for out in results for res, _ in out}
        assert len(accepted) == len(replicas) * ROUNDS * GROUP

        cid_of = {setup.conversation(T, c).id: c for c in CONVERSATIONS}
        sent: dict[str, tuple[int, str, int]] = {}  # message_id -> (position, conversation, seq)
        for n in setup.recorder.select_notifications(start=0, limit=100_000):
            event = setup.mapper.to_domain_event(n)
            if isinstance(event, Conversation.MessageSent):
                assert event.message_id not in sent, "a send written twice"
                sent[event.message_id] = (n.id, cid_of[n.originator_id], event.seq)
        assert set(sent) == set(accepted), "a send lost, or one written that nobody was answered"
        for message_id, res in accepted.items():
            position, _, seq = sent[message_id]
            assert seq == res["conversation_seq"]
            assert res["position"] >= position  # the last event its command wrote (its quota charge after it)
        for cid in CONVERSATIONS:
            seqs = sorted(seq for _, c, seq in sent.values() if c == cid)
            assert seqs == list(range(1, len(seqs) + 1)), cid
        assert sum(a.group_commits for a in replicas) > 0
        print("group commits", [a.group_commits for a in replicas], "fallbacks", [a.group_fallbacks for a in replicas])
    finally:
        for app in [*replicas, setup]:
            app.close()
