"""The online-push channel between processes (streams/pushes.py): a worker publishes each
Delivered after its unit of work committed (invariant O), every API replica receives every
push published after it started. Real Kafka (tests/engines.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Producer

from adapters.memory import MemoryViews
from fanout.urls import kafka_settings
from projections.delivery import Delivered
from projections.hosting import ViewsTracked
from projections.sharding import shard_of
from streams.heartbeats import FORMAT, WorkerBeat, WorkerBeats, encode_beat
from streams.host import ProjectionHost
from streams.kafka import partition_count
from streams.push_records import decode, encode, encode_tracked
from streams.pushes import BEAT_LOOKBACK, PushPublisher, PushSubscriber, ensure_pushes_topic, pushes_topic
from streams.records import EventRecord
from tests.host_log import PARAMS, LogBuilder, partitioned, write_log


def by_shard(users: list[str], shards: int = 4) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for u in sorted(users):
        out.setdefault(shard_of(u, shards), []).append(u)
    return out


def delivered(i: int, *, materialized: frozenset[str] | None = None, cid: str = "c") -> Delivered:
    return Delivered(
        tenant="acme",
        conversation_id=cid,
        seq=i,
        message={
            "conversation_id": cid,
            "conversation_seq": i,
            "message_id": f"m_{i}",
            "sender": "alice",
            "text": f"h\u00e9llo \U0001f600 @bob #{i}",
            "mentions": ["bob"],
            "mention_all": False,
            "reply_to_seq": None if i == 1 else i - 1,
            "announcement": False,
            "sent_at": 1_700_000_000.123456789 + i,
            "pos": 10 * i,
        },
        materialized=materialized,
        members_by_shard=by_shard(["alice", "bob", "carol"]),
        mailbox_shards=4,
    )


def test_a_push_record_round_trips_a_delivered_exactly() -> None:
    for d in (
        delivered(1),
        delivered(2, materialized=frozenset({"bob", "alice"})),
        delivered(3, materialized=frozenset()),
    ):
        back = decode(encode(d))
        assert isinstance(back, Delivered)
        assert back == d
        assert back.was_member("bob") and not back.was_member("dave")
        assert type(back.materialized) is type(d.materialized)
        assert all(isinstance(k, int) for k in back.members_by_shard)


def test_a_heartbeat_round_trips_and_is_not_a_push() -> None:
    b = WorkerBeat("host:12:ab", (0, 3), 1_700_000_000.5, 1.0, False)
    assert decode(encode_beat(b)) == b
    assert decode(encode_beat(WorkerBeat("w", (), 1.0, 2.0, True))) == WorkerBeat("w", (), 1.0, 2.0, True)
    counted = WorkerBeat("w", (1,), 1.0, 1.0, False, {"units": 7, "fenced": 2})
    back = decode(encode_beat(counted))
    assert isinstance(back, WorkerBeat) and back.counters == {"units": 7, "fenced": 2}
    beats = WorkerBeats()
    beats.seen(back)
    assert beats.counters() == {"w": {"units": 7, "fenced": 2}}


def test_the_positions_a_commit_left_round_trip_and_are_not_a_push() -> None:
    t = ViewsTracked({0: 17, 3: 2_000_000_001}, {0: 9, 3: 2_000_000_000}, (("acme", "c1"), ("acme", "c/2 é")))
    back = decode(encode_tracked(t))
    assert back == t and isinstance(back, ViewsTracked) and not isinstance(back, Delivered)
    assert all(isinstance(p, int) for p in back.positions) and all(isinstance(p, int) for p in back.since)
    # a record of a worker before ADR-0035 (no since, no heads): a replica's head cache sees a broken chain
    old = decode(b'{"v": %d, "kind": "tracked", "positions": {"0": 5}}' % FORMAT)
    assert old == ViewsTracked({0: 5})


def test_a_worker_is_alive_until_it_misses_its_beats_or_leaves() -> None:
    now = [100.0]
    beats = WorkerBeats(misses=5.0, clock=lambda: now[0])
    beats.seen(WorkerBeat("a", (0, 1), 0.0, 1.0))
    beats.seen(WorkerBeat("b", (2,), 0.0, 1.0))
    beats.seen(WorkerBeat("old", (3,), 0.0, 1.0), age=4.5)  # read back at start: beat 4.5 s ago
    assert beats.count() == 3 and beats.partitions() == {0, 1, 2, 3}
    now[0] += 1.0  # "old" has now missed 5 beats (killed: no last beat)
    assert beats.count() == 2 and beats.partitions() == {0, 1, 2}
    beats.seen(WorkerBeat("b", (), 0.0, 1.0, leaving=True))  # stopped: gone at once
    assert [b.worker for b in beats.alive()] == ["a"]
    now[0] += 3.9  # "a": 4.9 s since its beat
    assert beats.count() == 1
    now[0] += 0.2
    assert beats.count() == 0 and beats.partitions() == set()
    beats.seen(WorkerBeat("a", (0,), 0.0, 1.0))  # back (a paused worker resumed)
    assert beats.count() == 1


@pytest.mark.parametrize(
    "value",
    [b"", b"{}", b"[1]", b'{"v": 99}', b"\xff", b'{"v": 1, "tenant": "a"}', b'{"v": 1, "kind": "beat", "worker": "w"}'],
)
def test_anything_else_is_not_a_push_record(value: bytes) -> None:
    with pytest.raises(ValueError):
        decode(value)


@pytest.fixture
def pushes(fresh_kafka: str) -> Iterator[tuple[str, str]]:
    k = kafka_settings(fresh_kafka)
    topic = pushes_topic(k.topic)
    ensure_pushes_topic(k.brokers, topic, 4, 1, 0)
    yield k.brokers, topic


def test_every_push_published_after_a_subscriber_started_reaches_it_in_order(pushes: tuple[str, str]) -> None:
    brokers, topic = pushes
    assert partition_count(brokers, topic) == 4
    publisher = PushPublisher(brokers, topic, partitions=4)
    publisher.publish([delivered(0, cid="before")])  # before any subscriber: nobody gets it
    assert publisher.flush() == 0

    got: list[list[Delivered]] = [[], []]
    lock = threading.Lock()

    def collect(i: int) -> Any:
        def cb(d: Delivered) -> None:
            with lock:
                got[i].append(d)

        return cb

    subscribers = [  # two API replicas
        PushSubscriber(brokers, topic, collect(i), partitions=4).start() for i in range(2)
    ]
    try:
        sent = [delivered(s, cid=f"c{c}") for s in range(1, 21) for c in range(5)]
        # A record that is not a push (another writer) is skipped, not fatal.
        p = Producer({"bootstrap.servers": brokers})
        p.produce(topic, value=b"not json")
        p.flush(10)
        assert publisher.publish([*sent[:50], "not a Delivered", *sent[50:]]) == len(sent)
        assert publisher.flush() == 0
        deadline = time.monotonic() + 20
        while any(len(g) < len(sent) for g in got) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        for g in got:
            assert sorted(g, key=lambda d: (d.conversation_id, d.seq)) == sorted(
                sent, key=lambda d: (d.conversation_id, d.seq)
            )
            for c in range(5):  # a conversation's pushes keep their order (one partition)
                assert [d.seq for d in g if d.conversation_id == f"c{c}"] == list(range(1, 21))
        assert all(s.bad == 1 for s in subscribers)
    finally:
        for s in subscribers:
            s.stop()
        publisher.close()


def test_a_replica_skips_undecoded_the_pushes_of_tenants_it_holds_no_socket_of(pushes: tuple[str, str]) -> None:
    """`wants` sees each push's tenant from its header: the wanted tenant's pushes arrive in
    order, the others are counted as skipped and never reach the callback; heartbeats and the
    tracked positions still arrive, also the beat of a worker whose key (`worker/<id>`) looks
    like a push of a tenant named `worker`."""
    brokers, topic = pushes
    publisher = PushPublisher(brokers, topic, partitions=4)
    got: list[Delivered] = []
    tracked: list[ViewsTracked] = []
    beats = WorkerBeats()
    asked: list[str] = []

    def wants(tenant: str) -> bool:
        asked.append(tenant)
        return tenant == "acme"

    sub = PushSubscriber(
        brokers, topic, got.append, partitions=4, on_beat=beats.seen, on_tracked=tracked.append, wants=wants
    )
    sub.start()
    try:
        ours = [delivered(i, cid="c1") for i in range(1, 11)]
        theirs = [replace(delivered(i, cid="c1"), tenant=t) for i in range(1, 6) for t in ("beta", "worker")]
        assert publisher.publish([*theirs[:5], *ours[:5], ViewsTracked({0: 5}), *theirs[5:], *ours[5:]]) == 20
        publisher.beat(WorkerBeat("w1", (0, 1), time.time(), 1.0))
        assert publisher.flush() == 0
        deadline = time.monotonic() + 20
        while (len(got) < 10 or sub.skipped < 10 or beats.count() < 1 or not tracked) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert [d.seq for d in got] == list(range(1, 11)) and all(d.tenant == "acme" for d in got)
        assert sub.skipped == 10 and sub.received == 10 and sub.bad == 0
        assert sorted(set(asked)) == ["acme", "beta", "worker"] and len(asked) == 20
        assert beats.count() == 1 and [t.positions for t in tracked] == [{0: 5}]
    finally:
        sub.stop()
        publisher.close()


def test_a_replica_knows_the_live_workers_at_start_and_pushes_nothing_sent_before(pushes: tuple[str, str]) -> None:
    """The subscriber reads the last records of each partition back for their heartbeats
    only: a push published before it started reaches no callback."""
    brokers, topic = pushes
    publisher = PushPublisher(brokers, topic, partitions=4)
    try:
        publisher.publish([delivered(1, cid="before")])
        publisher.beat(WorkerBeat("w1", (0, 1), time.time(), 1.0))
        publisher.beat(WorkerBeat("w2", (2, 3), time.time() - 60, 1.0))  # a worker long gone
        publisher.beat(WorkerBeat("w3", (2, 3), time.time(), 1.0))
        publisher.beat(WorkerBeat("w3", (), time.time(), 1.0, leaving=True))  # and one stopped since
        assert publisher.flush() == 0
        got: list[Delivered] = []
        beats = WorkerBeats()
        sub = PushSubscriber(brokers, topic, got.append, partitions=4, on_beat=beats.seen).start()
        try:
            deadline = time.monotonic() + 10
            while beats.count() < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            assert [b.worker for b in beats.alive()] == ["w1"] and beats.partitions() == {0, 1}
            publisher.publish([delivered(2, cid="after")])
            publisher.beat(WorkerBeat("w2", (2, 3), time.time(), 1.0))  # back
            assert publisher.flush() == 0
            while (not got or beats.count() < 2) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert [d.conversation_id for d in got] == ["after"]
            assert beats.partitions() == {0, 1, 2, 3}
        finally:
            sub.stop()
    finally:
        publisher.close()


def test_a_subscriber_reads_back_only_the_last_records_of_a_partition(pushes: tuple[str, str]) -> None:
    brokers, topic = pushes
    publisher = PushPublisher(brokers, topic, partitions=4)
    try:
        old = WorkerBeat("w-old", (0,), time.time(), 1.0)
        publisher.beat(old)
        # The same key: the same partition; BEAT_LOOKBACK newer records push the old beat out of reach.
        for i in range(BEAT_LOOKBACK):
            publisher.beat(WorkerBeat("w-old", (0,), time.time(), 1.0, leaving=i == BEAT_LOOKBACK - 1))
        assert publisher.flush() == 0
        beats = WorkerBeats()
        sub = PushSubscriber(brokers, topic, lambda d: None, partitions=4, on_beat=beats.seen).start()
        try:
            time.sleep(1.0)
            assert beats.count() == 0  # its last beat said it left
        finally:
            sub.stop()
    finally:
        publisher.close()


def test_a_worker_publishes_a_push_only_after_its_unit_committed(pushes: tuple[str, str]) -> None:
    """The host calls on_effects after the commit: every Delivered it hands over is already
    readable (message, delivery record, the partition's tracked position), and a unit that
    fails hands over nothing; the published pushes are exactly the messages."""
    brokers, topic = pushes
    b = LogBuilder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    try:
        write_log(b, rounds=1)
        notes = b.notes()
    finally:
        b.close()

    class FailOnce(MemoryViews):
        fail = True

        def unit_of_work(self, *args: Any, **kwargs: Any) -> Any:
            from contextlib import contextmanager

            inner = super().unit_of_work

            @contextmanager
            def unit() -> Iterator[Any]:
                with inner(*args, **kwargs) as w:
                    yield w
                    if self.fail:
                        self.fail = False
                        raise OSError("injected")

            return unit()

    views = FailOnce()
    publisher = PushPublisher(brokers, topic, partitions=4)
    checked: list[tuple[Delivered, bool]] = []
    current = {"partition": 0}

    def on_effects(effects: Sequence[Any]) -> None:
        for d in effects:
            if isinstance(d, Delivered):
                committed = (
                    views.message(d.tenant, d.conversation_id, d.seq) is not None
                    and views.delivery(d.tenant, d.conversation_id, d.seq) is not None
                    and views.position("delivery", current["partition"]) >= d.message["pos"]
                )
                checked.append((d, committed))
        publisher.publish(effects)

    received: list[Delivered] = []
    subscriber = PushSubscriber(brokers, topic, received.append, partitions=4).start()
    try:
        host = ProjectionHost(views, PARAMS, lambda r: b.app.mapper.to_domain_event(r.stored_event()), on_effects)
        for p, records in partitioned(notes).items():
            current["partition"] = p
            if views.fail:
                with pytest.raises(OSError):
                    host.apply(p, records)
                assert checked == []  # the failed unit pushed nothing
            host.apply(p, records)
        publisher.flush()
        sent = sum(
            1
            for r in sum(partitioned(notes).values(), [])
            if isinstance(r, EventRecord) and r.topic.endswith("MessageSent")
        )
        deadline = time.monotonic() + 20
        while len(received) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(checked) == sent and all(ok for _, ok in checked)
        assert sorted(received, key=lambda d: (d.tenant, d.conversation_id, d.seq)) == sorted(
            (d for d, _ in checked), key=lambda d: (d.tenant, d.conversation_id, d.seq)
        )
    finally:
        subscriber.stop()
        publisher.close()
