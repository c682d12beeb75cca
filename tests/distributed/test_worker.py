"""The projection worker (`fanout worker`, streams/worker.py) against the real engines.

A real log is written with FanoutApplication on a fresh PostgreSQL database (the event
store the worker decodes with); the embedded runner folds the same log into in-memory
views: the reference. The test then plays the relay: it produces the log's notifications
to a fresh Kafka topic (4 partitions) in transactions, keyed by aggregate id, each
transaction ending with a watermark record on every partition (streams/records.py), and
runs `python -m cli.worker` over views of its own. The worker's views must equal the
reference (every query a client can make: heads, messages, delivery records, sessions,
mailboxes, reviews, tiers, capacity totals), whatever Kafka redelivers, and never show a
record of an aborted transaction.

The unit-of-work logic (ProjectionHost) is also driven directly over the in-memory views:
batch splits, redelivery, a failing unit, a revoked partition."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from adapters.memory import MemoryViews
from domain.params import Parameters
from domain.tier import Tier
from fanout.application import FanoutApplication
from fanout.bootstrap import open_views, open_views_only
from fanout.clock import FakeClock
from fanout.queries import Queries
from fanout.urls import kafka_settings, postgres_env
from projections.capacity import merged, state_name
from projections.delivery import Delivered
from projections.hosting import PROJECTIONS
from streams.embedded import EmbeddedRunner
from streams.host import ProjectionHost, Record
from streams.pushes import PushSubscriber, ensure_topic, pushes_topic
from streams.records import EventRecord, Watermark
from streams.relay import RoutingKeys
from streams.routing import partition_of

ROOT = Path(__file__).resolve().parents[2]
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
    return {**{k: st[k] for k in ("slots", "entries_total", "messages_total")}, "firing": {k for k, v in st["firing"].items() if v}}


# -- playing the relay ---------------------------------------------------------------------------


def event_record(n: Any) -> EventRecord:
    return EventRecord(n.id, n.topic, n.originator_id, n.originator_version, bytes(n.state))


class FakeRelay:
    """Produces notifications as the relay does: in one Kafka transaction per call, keyed
    by aggregate id, ending with a watermark record on every partition."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"test-relay-{uuid.uuid4().hex}", "linger.ms": 5}
        )
        self.producer.init_transactions(30)

    def send(
        self,
        records: Sequence[tuple[str | None, EventRecord | Watermark]],
        *,
        watermark: int | None,
        abort: bool = False,
    ) -> None:
        p = self.producer
        p.begin_transaction()
        for key, r in records:
            value = r.state if isinstance(r, EventRecord) else b""
            p.produce(self.topic, key=None if key is None else key.encode(), value=value, headers=r.headers())
        if watermark is not None:
            for part in range(PARTITIONS):
                p.produce(self.topic, partition=part, value=b"", headers=Watermark(watermark).headers())
        if abort:
            p.flush(30)
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)

    def send_notes(self, notes: Sequence[Any], chunk: int = 40) -> None:
        for i in range(0, len(notes), chunk):
            part = notes[i : i + chunk]
            self.send([(routing_key(n), event_record(n)) for n in part], watermark=part[-1].id)


# -- the worker subprocess ----------------------------------------------------------------------


class WorkerProcess:
    def __init__(self, env: dict[str, str], log_path: Path, *extra: str, loglevel: str = "warning") -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.worker", "--loglevel", loglevel, "--session-timeout", "6", *extra],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._log.close()
        return code

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def assignment(self) -> set[int] | None:
        """The partitions of its last assignment (logged at info), None before any."""
        lines = [line for line in self.output().splitlines() if "partitions assigned: [" in line]
        if not lines:
            return None
        return {int(x) for x in lines[-1].rsplit("[", 1)[1].split("]")[0].split(",") if x.strip()}


def worker_env(postgres: str, kafka: str, views: str, data_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    env.update(
        FANOUT_EVENT_STORE=postgres,
        FANOUT_LOG=kafka,
        FANOUT_VIEWS=views,
        FANOUT_MAILBOX_SHARDS=str(PARAMS.mailbox_shards),
    )
    if data_dir is not None:
        env["FANOUT_DATA_DIR"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_tracked(
    read_positions: Callable[[], dict[tuple[str, int], int]],
    position: int,
    workers: Sequence[WorkerProcess],
    timeout: float = 90.0,
) -> dict[tuple[str, int], int]:
    """Until every (projection, partition) tracks at least `position`."""
    deadline = time.monotonic() + timeout
    positions: dict[tuple[str, int], int] = {}
    while time.monotonic() < deadline:
        positions = read_positions()
        if all(positions.get((name, p), 0) >= position for name in PROJECTIONS for p in range(PARTITIONS)):
            return positions
        for w in workers:
            assert w.proc.poll() is None, f"the worker exited ({w.proc.returncode}):\n{w.output()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(
        f"the views did not reach {position} in {timeout} s: {positions}\n"
        + "\n".join(w.output()[-3000:] for w in workers)
    )


def sqlite_positions(data_dir: Path) -> Callable[[], dict[tuple[str, int], int]]:
    def read() -> dict[tuple[str, int], int]:
        if not (data_dir / "views.sqlite").exists() and not any(data_dir.glob("*.sqlite")):
            return {}
        v = open_views_only(data_dir, readonly=True)
        try:
            return v.positions()
        except Exception:
            return {}
        finally:
            v.close()

    return read


@pytest.fixture
def log(fresh_postgres: str) -> Iterator[LogBuilder]:
    b = LogBuilder(postgres_env(fresh_postgres))
    try:
        write_log(b)
        yield b
    finally:
        b.close()


# -- a, b, e: one worker builds the reference views; a redelivery changes nothing -----------------


def test_one_worker_builds_the_reference_views_and_a_redelivery_changes_nothing(
    log: LogBuilder, fresh_postgres: str, fresh_kafka: str, tmp_path: Path
) -> None:
    kafka = kafka_settings(fresh_kafka)
    ensure_topic(kafka.bootstrap, kafka.topic, PARTITIONS)
    ensure_topic(kafka.bootstrap, pushes_topic(kafka.topic), PARTITIONS)
    notes = log.notes()
    top = notes[-1].id
    sent = sum(1 for n in notes if n.topic.endswith("MessageSent"))
    reference = snapshot(log.views)
    data_dir = tmp_path / "views"
    data_dir.mkdir()

    # Every push, with what the views held when it arrived (invariant O across processes).
    received: list[tuple[Delivered, bool]] = []

    def on_push(d: Delivered) -> None:
        v = open_views_only(data_dir, readonly=True)
        try:
            committed = (
                v.message(d.tenant, d.conversation_id, d.seq) is not None
                and v.delivery(d.tenant, d.conversation_id, d.seq) is not None
            )
        finally:
            v.close()
        received.append((d, committed))

    subscriber = PushSubscriber(kafka.bootstrap, pushes_topic(kafka.topic), on_push).start()
    relay = FakeRelay(kafka.bootstrap, kafka.topic)
    env = worker_env(fresh_postgres, fresh_kafka, "sqlite", data_dir)
    try:
        relay.send_notes(notes[: len(notes) // 2])
        started = time.monotonic()
        worker = WorkerProcess(env, tmp_path / "worker1.log")
        relay.send_notes(notes[len(notes) // 2 :])  # while the worker runs
        try:
            wait_tracked(sqlite_positions(data_dir), top, [worker])
            applied_in = time.monotonic() - started
            deadline = time.monotonic() + 10
            while len(received) < sent and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]
        assert "Traceback" not in worker.output(), worker.output()[-3000:]
        print(f"one worker: {len(notes)} records applied {applied_in:.1f} s after its start")

        views = open_views(data_dir, PARAMS.mailbox_shards)
        try:
            assert snapshot(views) == reference
            assert capacity_totals(views, range(PARTITIONS)) == capacity_totals(log.views, [0])
            assert views.positions() == {(name, p): top for name in PROJECTIONS for p in range(PARTITIONS)}
        finally:
            views.close()

        # e: one push per message, each published after its unit of work committed.
        assert len(received) == sent
        assert all(committed for _, committed in received)
        assert {(d.tenant, d.conversation_id, d.seq) for d, _ in received} == {
            (t, f"c{i}", s)
            for t in TENANTS
            for i in range(6)
            for s in range(1, reference[f"head/{t}/c{i}"]["latest_conversation_seq"] + 1)
        }

        # b: a new consumer group reads the whole topic again over views that hold it all.
        pushes_before = len(received)
        worker = WorkerProcess(env, tmp_path / "worker2.log", "--app-id", f"redelivery-{uuid.uuid4().hex[:8]}")
        try:
            relay.send([], watermark=top + 1)  # after every redelivered record, in each partition
            wait_tracked(sqlite_positions(data_dir), top + 1, [worker])
            time.sleep(0.5)
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]
        assert "redelivered skipped" in worker.output()
        views = open_views(data_dir, PARAMS.mailbox_shards)
        try:
            assert snapshot(views) == reference  # mention counts, broadcasts, mailboxes: unchanged
            assert capacity_totals(views, range(PARTITIONS)) == capacity_totals(log.views, [0])
        finally:
            views.close()
        assert len(received) == pushes_before  # nothing applied, nothing pushed again
    finally:
        subscriber.stop()


# -- d: an aborted transaction is never applied ----------------------------------------------------


def test_records_of_an_aborted_transaction_are_never_applied(
    log: LogBuilder, fresh_postgres: str, fresh_kafka: str, tmp_path: Path
) -> None:
    kafka = kafka_settings(fresh_kafka)
    ensure_topic(kafka.bootstrap, kafka.topic, PARTITIONS)
    notes = log.notes()
    top = notes[-1].id
    reference = snapshot(log.views)
    relay = FakeRelay(kafka.bootstrap, kafka.topic)
    half = len(notes) // 2
    relay.send_notes(notes[:half])
    # The aborted transaction: a MessageSent again, at a position far ahead, and a watermark
    # there. Applied, it would count a mention twice and make every later event look old.
    forged_from = next(n for n in notes[half:] if n.topic.endswith("MessageSent"))
    forged = EventRecord(
        10**6, forged_from.topic, forged_from.originator_id, forged_from.originator_version, bytes(forged_from.state)
    )
    relay.send([(str(forged_from.originator_id), forged)], watermark=10**6, abort=True)
    relay.send_notes(notes[half:])

    # The aborted records are in the topic: a read_uncommitted consumer sees them.
    seen = read_all(kafka.bootstrap, kafka.topic, "read_uncommitted")
    assert 10**6 in seen and 10**6 not in read_all(kafka.bootstrap, kafka.topic, "read_committed")

    data_dir = tmp_path / "views"
    data_dir.mkdir()
    worker = WorkerProcess(worker_env(fresh_postgres, fresh_kafka, "sqlite", data_dir), tmp_path / "worker.log")
    try:
        wait_tracked(sqlite_positions(data_dir), top, [worker])
        time.sleep(1.0)  # the aborted records are before the last ones in each partition: all read by now
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    views = open_views(data_dir, PARAMS.mailbox_shards)
    try:
        assert views.positions() == {(name, p): top for name in PROJECTIONS for p in range(PARTITIONS)}
        assert snapshot(views) == reference
    finally:
        views.close()


def read_all(bootstrap: str, topic: str, isolation: str) -> list[int]:
    """The positions (events' and watermarks') of every record of the topic."""
    from streams.records import position_of

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        ends = {}
        for p in meta.partitions:
            _, ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        c.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        out: list[int] = []
        deadline = time.monotonic() + 20
        done: set[int] = set()
        while len(done) < len(ends) and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error() is not None:
                for p in ends:
                    pos = c.position([TopicPartition(topic, p)])[0].offset
                    if pos >= ends[p]:
                        done.add(p)
                continue
            pos = position_of(m.headers())
            if pos is not None:
                out.append(pos)
        return out
    finally:
        c.close()


# -- the units of work, driven directly (in-memory views, no Kafka) ------------------------------


_KEYS: RoutingKeys | None = None


def routing_key(note: Any) -> str:
    """The relay's key of a notification (streams.relay.RoutingKeys: a member's reads go with
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


@pytest.fixture(scope="module")
def popo_log() -> Iterator[LogBuilder]:
    b = LogBuilder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    try:
        write_log(b, rounds=1)
        yield b
    finally:
        b.close()


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_the_host_builds_the_reference_views_whatever_the_batches(popo_log: LogBuilder, batch: int) -> None:
    views = MemoryViews()
    effects: list[Any] = []
    host = host_for(popo_log, views, effects)
    by_partition = partitioned(popo_log.notes())
    for p, records in by_partition.items():
        for i in range(0, len(records), batch):
            host.apply(p, records[i : i + batch])
    assert snapshot(views) == snapshot(popo_log.views)
    sent = sum(
        1 for r in sum(by_partition.values(), []) if isinstance(r, EventRecord) and r.topic.endswith("MessageSent")
    )
    assert sum(isinstance(e, Delivered) for e in effects) == sent

    # Redelivered from the start, by a fresh host (a rebalance) and by this one: nothing changes.
    before = snapshot(views)
    for h in (host, host_for(popo_log, views, effects)):
        n = len(effects)
        for p, records in by_partition.items():
            h.apply(p, records)
        assert snapshot(views) == before and len(effects) == n


class FailingViews(MemoryViews):
    """In-memory views whose units of work fail while `failures` > 0 (after the writes)."""

    failures = 0

    def unit_of_work(self, *args: Any, **kwargs: Any) -> Any:
        from contextlib import contextmanager

        inner = super().unit_of_work

        @contextmanager
        def unit() -> Iterator[Any]:
            with inner(*args, **kwargs) as w:
                yield w
                if self.failures > 0:
                    self.failures -= 1
                    raise OSError("disk I/O error (injected)")

        return unit()


def test_a_failed_unit_changes_nothing_and_the_retry_applies_it_once(popo_log: LogBuilder) -> None:
    views = FailingViews()
    effects: list[Any] = []
    host = host_for(popo_log, views, effects)
    by_partition = partitioned(popo_log.notes())
    for p, records in by_partition.items():
        half = len(records) // 2
        host.apply(p, records[:half])
        views.failures = 2
        for _ in range(2):
            with pytest.raises(OSError):
                host.apply(p, records[half:])
        host.apply(p, records[half:])  # the same records again, as the worker retries them
    assert snapshot(views) == snapshot(popo_log.views)
    assert host.stats.failures == 2 * PARTITIONS
    sent = sum(1 for n in popo_log.notes() if n.topic.endswith("MessageSent"))
    assert sum(isinstance(e, Delivered) for e in effects) == sent  # effects only of committed units


def test_a_revoked_partition_is_forgotten_and_reloaded_from_the_views(popo_log: LogBuilder) -> None:
    views = MemoryViews()
    by_partition = partitioned(popo_log.notes())
    first, second = host_for(popo_log, views), host_for(popo_log, views)
    for p, records in by_partition.items():
        half = len(records) // 2
        first.apply(p, records[:half])
    assert all(len(records) > 2 for records in by_partition.values()), "a partition without events"
    first.forget([0, 1])
    assert first.partitions == [2, 3]
    # Another worker takes partitions 0 and 1 over from their first record; this one keeps 2, 3.
    for p, records in by_partition.items():
        (second if p in (0, 1) else first).apply(p, records)
    assert snapshot(views) == snapshot(popo_log.views)
    assert second.stats.skipped > 0


# -- c: two workers share the partitions; one is killed mid-stream ---------------------------------


def cassandra_views(url: str) -> Any:
    from adapters.cassandra_mailbox import CassandraMailbox
    from adapters.cassandra_views import CassandraViews
    from fanout.urls import cassandra_settings

    c = cassandra_settings(url)
    return CassandraViews.from_settings(c, CassandraMailbox.from_settings(c), partitions=PARTITIONS)


def test_two_workers_share_the_partitions_and_one_killed_mid_stream_loses_nothing(
    fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path
) -> None:
    b = LogBuilder(postgres_env(fresh_postgres))
    try:
        write_log(b, rounds=4)
        notes = b.notes()
        reference = snapshot(b.views)
        reference_capacity = capacity_totals(b.views, [0])
    finally:
        b.close()
    top = notes[-1].id
    kafka = kafka_settings(fresh_kafka)
    ensure_topic(kafka.bootstrap, kafka.topic, PARTITIONS)
    relay = FakeRelay(kafka.bootstrap, kafka.topic)
    views = cassandra_views(fresh_cassandra)  # creates the schema before the workers race to
    env = worker_env(fresh_postgres, fresh_kafka, fresh_cassandra)
    first = notes[: len(notes) // 4]
    relay.send_notes(first)
    workers = [WorkerProcess(env, tmp_path / f"worker{i}.log", loglevel="info") for i in range(2)]
    try:
        wait_tracked(views.positions, first[-1].id, workers)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the group settles: each worker holds some partitions
            held = [w.assignment() for w in workers]
            if (
                all(held)
                and set().union(*held) == set(range(PARTITIONS))
                and not (held[0] or set()) & (held[1] or set())
            ):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the two workers did not share the partitions: {held}")
        rest = notes[len(first) :]
        chunk = 20
        killed_at = None
        for i in range(0, len(rest), chunk):
            relay.send_notes(rest[i : i + chunk], chunk=chunk)
            if killed_at is None and i >= len(rest) // 3:
                workers[0].proc.send_signal(signal.SIGKILL)  # mid-stream: its last unit may be half written
                workers[0].proc.wait(10)
                killed_at = rest[i + chunk - 1].id if i + chunk - 1 < len(rest) else top
            time.sleep(0.05)
        assert killed_at is not None
        started = time.monotonic()
        wait_tracked(views.positions, top, workers[1:], timeout=120)
        print(
            f"two workers {held}, the first killed at position ~{killed_at}: the other took "
            f"{workers[1].assignment()} and caught up in {time.monotonic() - started:.1f} s"
        )
        assert workers[1].assignment() == set(range(PARTITIONS))
        assert snapshot(views) == reference
        assert capacity_totals(views, range(PARTITIONS)) == reference_capacity
        assert views.positions() == {(name, p): top for name in PROJECTIONS for p in range(PARTITIONS)}
    finally:
        for w in workers:
            w.stop()
        views.close()
    out = workers[1].output()
    assert "Traceback" not in out, out[-3000:]


# -- measuring (not a test): python -m tests.distributed.test_worker [MESSAGES] ----------------------


def bench(messages: int = 4000) -> None:
    """Events/s applied by the unit-of-work host over the in-memory and the SQLite views
    (in-process), and by one `python -m cli.worker` subprocess over SQLite views from a real
    Kafka topic (engines.env), on a log of `messages` sends to 20 conversations of 50."""
    import tempfile

    from tests.engines import infra_engines as ie
    from tests.engines import unique, with_query

    urls = ie.read_env_file()
    b = LogBuilder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    members = [f"u{i}" for i in range(50)]
    for c in range(20):
        b.app.create_conversation("acme", f"c{c}", f"c{c}", members)
    for i in range(messages):
        b.clock.advance(1.0)
        b.app.send_message("acme", f"c{i % 20}", sender=members[i % 50], text=f"m{i}", mentions=[members[(i + 1) % 50]])
    notes = b.notes()
    events = len(notes)
    print(f"log: {events} events ({messages} messages, {messages * 50} mailbox entries)")
    for name in ("memory", "sqlite"):
        tmp = Path(tempfile.mkdtemp())
        views = MemoryViews() if name == "memory" else open_views(tmp, PARAMS.mailbox_shards)
        host = host_for(b, views)
        started = time.perf_counter()
        for p, records in partitioned(notes).items():
            for i in range(0, len(records), 500):
                host.apply(p, records[i : i + 500])
        took = time.perf_counter() - started
        print(f"host over {name} views, batches of 500: {events / took:,.0f} events/s ({took:.2f} s)")
        views.close()
    topic_url = with_query(urls["FANOUT_LOG"], topic=unique("bench"), partitions=PARTITIONS)
    kafka = kafka_settings(topic_url)
    ensure_topic(kafka.bootstrap, kafka.topic, PARTITIONS)
    FakeRelay(kafka.bootstrap, kafka.topic).send_notes(notes, chunk=500)
    tmp = Path(tempfile.mkdtemp())
    worker = WorkerProcess(worker_env(urls["FANOUT_EVENT_STORE"], topic_url, "sqlite", tmp / "v"), tmp / "w.log")
    try:
        read = sqlite_positions(tmp / "v")
        first = None
        while True:
            pos = read()
            if first is None and any(pos.values()):
                first = time.perf_counter()
            if pos and all(pos.get((n, p), 0) >= notes[-1].id for n in PROJECTIONS for p in range(PARTITIONS)):
                break
            assert worker.proc.poll() is None, worker.output()
            time.sleep(0.05)
        took = time.perf_counter() - (first or time.perf_counter())
        print(
            f"one worker subprocess, SQLite views, from Kafka: {events / took:,.0f} events/s after its first commit ({took:.2f} s)"
        )
    finally:
        worker.stop()
    b.close()


if __name__ == "__main__":
    bench(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
