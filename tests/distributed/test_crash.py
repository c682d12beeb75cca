"""Crash tests of the distributed runtime on the real engines: during the fan-out of
messages to a large group (10,000 members, FANOUT_CRASH_MEMBERS), kill -9 an API replica (a sender subprocess), the relay
or a worker, or restart the Kafka broker or Cassandra; then every member's mailbox holds
each message exactly once, every count is exact, and the Cassandra views equal what the
embedded projection code builds from the same PostgreSQL log (in memory), and `fanout verify`
(tools.rebuild.verify) finds no difference.

Each scenario is one deployment (its own database, topic and keyspace; the group created
once) and one run, its fault at a NAMED STEP (projections/failpoints.py), not
at a random moment: the sender killed just before or just after its event-store transaction
(`command.recording` / `command.recorded`), the relay between producing a transaction and
committing it (`relay.produced`), a worker in the middle of the mailbox round of a message's
commit (`commit.mailbox.part`: about 3/4 of its batches sent; killed there, or stopped there while Kafka or Cassandra
restarts). Each scenario asserts where its fault landed: the failpoint fired (the file it
leaves in FANOUT_FAILPOINTS_FIRED), and the mailbox entries written at that moment were
strictly between none and all of the run's (a sample of members read). FANOUT_CRASH_MEMBERS
and FANOUT_CRASH_MESSAGES change the size; FANOUT_CRASH_STEP moves the worker's fault to
another step of the commit (`mailbox`, `rows`, `heads`, `tracking`: the tests then say the
fault landed outside the fan-out, which shows they can tell).

Restarting Kafka or Cassandra affects every test sharing the engines: the tests doing it
always run the up script in a `finally`, which waits until the engine answers again."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from adapters.memory import MemoryViews
from domain.params import Parameters
from fanout.config import load_settings
from fanout.distributed import DistributedRuntime
from fanout.queries import Queries
from fanout.urls import kafka_settings
from projections.capacity import merged, state_name
from projections.errors import StorageUnavailable
from projections.hosting import build_projections
from streams.positions import relayed_position
from tests.distributed.cluster import ROOT, Cluster, cluster_for
from tests.engines import with_query
from tools.rebuild import verify as verify_views

pytestmark = pytest.mark.slow

T = "acme"
CID = "big"
MEMBERS = int(os.environ.get("FANOUT_CRASH_MEMBERS", "10000"))
IN_FLIGHT = 16  # a round's requests in the air (the URL's in_flight; 200 by default)
RUNS = int(os.environ.get("FANOUT_CRASH_RUNS", "1"))  # the cluster scenarios' runs (tests/cluster)
PER_RUN = int(os.environ.get("FANOUT_CRASH_MESSAGES", "2"))  # messages per run
STEP = os.environ.get("FANOUT_CRASH_STEP", "mailbox.part")  # the worker's commit step of scenarios c, d, e
SEED = int(os.environ.get("FANOUT_CRASH_SEED") or random.SystemRandom().randrange(1_000_000))
USERS = [f"u{i:06d}" for i in range(MEMBERS)]
SENDERS = USERS[1:4]
MENTIONED = USERS[-1]
ENGINES_SCRIPTS = ROOT / "infra" / "engines"
ENGINES_DIR = Path(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines"))
SETTINGS = {
    "FANOUT_PER_SENDER_IN_CONVERSATION_RATE": "1000/s",
    "FANOUT_PER_CONVERSATION_MSG_RATE": "1000/1000/1000",
}


def rng(scenario: str, run: int) -> random.Random:
    print(f"\n[{scenario} run {run}] FANOUT_CRASH_SEED={SEED}", flush=True)
    return random.Random(f"{SEED}/{scenario}/{run}")


# -- the deployment ----------------------------------------------------------------------


@dataclass
class Deployment:
    cluster: Cluster
    rt: DistributedRuntime  # the test's own API replica (in-process): sends and reads
    params: Parameters
    sample: list[str]  # members whose mailboxes are read to see where a fan-out is
    acked: set[str] = field(default_factory=set)  # message ids acknowledged to a sender
    sent: int = 0  # messages sent so far (names and senders)
    notes: list[str] = field(default_factory=list)  # one line per run, printed at the end
    fired: Path | None = None  # FANOUT_FAILPOINTS_FIRED: a file per failpoint that fired
    failpoints: dict[str, str] = field(default_factory=dict)  # process kind -> FANOUT_FAILPOINTS

    def env_of(self, name: str) -> dict[str, str] | None:
        """FANOUT_FAILPOINTS for process `name` (relay, worker, worker-2: by its kind)."""
        spec = self.failpoints.get(name.split("-")[0])
        if spec is None:
            return None
        return {"FANOUT_FAILPOINTS": spec, "FANOUT_FAILPOINTS_FIRED": str(self.fired)}

    def fired_in(self, point: str, timeout: float = 60.0) -> int:
        """The pid of the process that hit `point` (the failpoint's file names it), once one has."""
        assert self.fired is not None
        path = self.fired / point
        deadline = time.monotonic() + timeout
        while not (path.exists() and path.read_text()):
            assert time.monotonic() < deadline, f"failpoint {point} never fired in {timeout} s: {logs(self)}"
            time.sleep(0.02)
        return int(path.read_text())

    def name_of(self, pid: int) -> str:
        return next(n for n, p in self.cluster.procs.items() if p.pid == pid)

    def send(self, tag: str, count: int = 1) -> list[dict[str, Any]]:
        out = []
        for _ in range(count):
            i = self.sent
            self.sent += 1
            r = self.rt.app.send_message(
                T,
                CID,
                sender=SENDERS[i % len(SENDERS)],
                text=f"{tag} message {i}",
                mentions=[MENTIONED] if i % 2 == 0 else [],
                client_msg_id=f"{tag}-{i}",
            )
            self.acked.add(str(r["message_id"]))
            out.append(r)
        return out

    def latest(self) -> int:
        return int(self.rt.app.log_position())


@pytest.fixture
def deployment(
    request: pytest.FixtureRequest, fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path
) -> Iterator[Deployment]:
    """The deployment; a test marked `failpoints(relay=..., worker=...)` has those processes
    started with FANOUT_FAILPOINTS (the workers all alike: the first to reach the point fires)."""
    started = time.monotonic()
    c = cluster_for(
        {
            "FANOUT_EVENT_STORE": fresh_postgres,
            "FANOUT_LOG": fresh_kafka,
            # IN_FLIGHT requests of a round in the air: a worker stopped or killed amid round A has
            # sent most of its batches and had all but IN_FLIGHT of them land (mid_fanout)
            "FANOUT_VIEWS": fresh_cassandra
            if "in_flight=" in fresh_cassandra  # the cluster's URL says its own (tests/cluster)
            else with_query(fresh_cassandra, in_flight=IN_FLIGHT),
        },
        tmp_path / "logs",
        **SETTINGS,
    )
    marker = request.node.get_closest_marker("failpoints")
    fired = tmp_path / "fired"
    fired.mkdir()
    try:
        rt = c.replica()  # the event store's tables and the keyspace before the others start
        d = Deployment(c, rt, Parameters(), [], fired=fired, failpoints=dict(marker.kwargs) if marker else {})
        c.start("relay", d.env_of("relay"))
        c.start("worker", d.env_of("worker"))
        rt.app.create_conversation(T, CID, "crash test", USERS)
        c.wait_workers(1)
        c.settle(rt, timeout=180)
        d.params = load_settings({**c.urls, **c.settings_env}).params
        d.sample = random.Random(SEED).sample(USERS, 100)
        print(f"\n{MEMBERS}-member group projected in {time.monotonic() - started:.1f} s", flush=True)
        yield d
        print("\n" + "\n".join(d.notes), flush=True)
    finally:
        c.close()


# -- where a fan-out is: the mailboxes of a sample of members -----------------------------------


def written(d: Deployment, seqs: range) -> dict[int, float]:
    """seq -> the fraction of the sample whose mailbox holds it: the store's own cursor read
    of each member, up to any position (not the views' one), 16 at once. A member whose read
    fails on the engine (Cassandra restarting) counts as not holding it; any other error
    fails the test."""
    mb: Any = d.rt.views.mailbox

    def held(user: str) -> list[int]:
        try:
            return [e[2] for e in mb.read(T, user, 0, 2**62, 10_000)]
        except StorageUnavailable:
            return []

    have: collections.Counter[int] = collections.Counter()
    with ThreadPoolExecutor(16) as pool:
        for seqs_held in pool.map(held, d.sample):
            have.update(seqs_held)
    return {s: have[s] / len(d.sample) for s in seqs}


def wait_fanout_started(d: Deployment, seq: int, timeout: float = 60.0) -> float:
    """Until the first entries of message `seq` appear in the sample; returns the wait."""
    t0 = time.monotonic()
    while not written(d, range(seq, seq + 1))[seq]:
        assert time.monotonic() - t0 < timeout, f"seq {seq} not fanned out in {timeout} s: {logs(d)}"
        time.sleep(0.05)
    return time.monotonic() - t0


def fmt(fractions: dict[int, float]) -> str:
    return " ".join(f"seq{s}:{f:.0%}" for s, f in fractions.items())


def logs(d: Deployment) -> dict[str, str]:
    return {n: d.cluster.log_of(n)[-1500:] for n in ("relay", "worker", "worker-2")}


def settle(d: Deployment, timeout: float = 180.0) -> float:
    t0 = time.monotonic()
    d.cluster.settle(d.rt, timeout)
    return time.monotonic() - t0


def reconnected(d: Deployment, timeout: float = 60.0) -> None:
    """Until this process's own Cassandra sessions answer again after a restart of the node:
    the workers can catch up (and the replica learn their position from the push stream)
    before its driver's next reconnection attempt (at most 5 s apart)."""
    views: Any = d.rt.views
    t0 = time.monotonic()
    while True:
        try:
            views.head(T, CID)
            views.mailbox.read(T, d.sample[0], 0, 2**62, 1)
            return
        except StorageUnavailable as exc:
            assert time.monotonic() - t0 < timeout, f"views unreachable {timeout} s after the restart: {exc}"
            time.sleep(0.2)


def check_run(d: Deployment) -> int:
    """After a run: every message in the views is materialized to every member."""
    latest = d.rt.views.head(T, CID)["latest_conversation_seq"]  # type: ignore[index]
    for seq in range(1, latest + 1):
        rec = d.rt.views.delivery(T, CID, seq)
        assert rec is not None and rec["materialized_at"] is not None, (seq, rec)
        assert rec["mailbox_entries"] == MEMBERS, (seq, rec)
    stored = {m["message_id"] for m in d.rt.views.messages(T, CID, 0, 10_000)}
    assert d.acked <= stored, f"acknowledged, not delivered: {sorted(d.acked - stored)}"
    return int(latest)


# -- the verification: exactly once, exact counts, equal to the embedded projections ---------------


def reference(d: Deployment) -> MemoryViews:
    """The PostgreSQL notification log replayed through the embedded projection code
    (build_projections) into in-memory views, one unit of work per event."""
    views = MemoryViews()
    projections = build_projections(cast(Any, views), d.params)
    app = d.rt.app
    for n in app.recorder.select_notifications(start=1, limit=1_000_000):
        event = app.mapper.to_domain_event(n)
        with views.unit_of_work() as w:
            for p in projections:
                if type(event) in p.topics:
                    p.process(event, n.id, w)
            for p in projections:
                p.flush(w)
                w.track(p.name, n.id)
    return views


def strip(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A delivery record without the runtime facts (when, and pushes to who was online)."""
    return (
        None if record is None else {k: v for k, v in record.items() if k not in ("materialized_at", "online_pushes")}
    )


def verify(d: Deployment) -> str:
    t0 = time.monotonic()
    settle(d)
    laps: dict[str, float] = {}
    lap = time.monotonic()

    def timed(name: str) -> None:
        nonlocal lap
        now = time.monotonic()
        laps[name] = now - lap
        lap = now

    views, ref = d.rt.views, reference(d)
    timed("reference")
    # Heads, messages and delivery records equal the reference's; every message reached all.
    head = views.head(T, CID)
    assert head == ref.head(T, CID)
    assert head is not None
    latest = head["latest_conversation_seq"]
    messages = views.messages(T, CID, 0, 10_000)
    assert messages == ref.messages(T, CID, 0, 10_000)
    assert [m["conversation_seq"] for m in messages] == list(range(1, latest + 1))
    assert d.acked <= {m["message_id"] for m in messages}, "an acknowledged message is missing"
    for seq in range(1, latest + 1):
        rec = views.delivery(T, CID, seq)
        assert rec is not None and rec["materialized_at"] is not None and rec["mailbox_entries"] == MEMBERS, rec
        assert strip(rec) == strip(ref.delivery(T, CID, seq)), seq
    # Member states (the conversation-keyed partition) and the broadcasts.
    _, states, casts = views.load_conversation(T, CID)
    _, ref_states, ref_casts = ref.load_conversation(T, CID)
    assert len(states) == MEMBERS
    assert states == ref_states, [u for u in ref_states if states.get(u) != ref_states[u]][:10]
    assert casts == ref_casts
    timed("states")
    # Every member's mailbox holds each message exactly once.
    entries = list(views.mailbox.all_entries())
    timed("scan")
    per_seq: collections.Counter[int] = collections.Counter()
    seen: set[tuple[str, int]] = set()
    for tenant, user, _pos, seq, cid, _flags in entries:
        assert (tenant, cid) == (T, CID)
        assert (user, seq) not in seen, f"{user} holds seq {seq} twice"
        seen.add((user, seq))
        per_seq[seq] += 1
    assert dict(per_seq) == {s: MEMBERS for s in range(1, latest + 1)}
    assert entries == list(ref.mailbox.all_entries())
    timed("mailboxes")
    # Exact counts in the session lists (senders, the mentioned member, a sample).
    q, rq = Queries(views, d.params), Queries(ref, d.params)
    mentioned = [m["conversation_seq"] for m in messages if MENTIONED in m["mentions"]]
    for user in ["u000000", *SENDERS, MENTIONED, *d.sample[:20]]:
        sessions, big = q.session_list(T, user)
        assert (sessions, big) == rq.session_list(T, user), user
        (s,) = sessions
        read = max((m["conversation_seq"] for m in messages if m["sender"] == user), default=0)
        assert s["read_conversation_seq"] == read, (user, s)
        assert s["unread_count"] == latest - read and s["unread_exact"], (user, s)
        assert s["mention_count"] == (len([x for x in mentioned if x > read]) if user == MENTIONED else 0), (user, s)
        assert s["latest_conversation_seq"] == latest, (user, s)
    timed("sessions")
    # The capacity totals merged over the log's partitions.
    parts = [views.capacity_state(state_name(p)) for p in range(d.rt.partitions)]
    totals = merged(d.params, [s for s in parts if s]).state()
    ref_totals = merged(d.params, [ref.capacity_state(state_name(0)) or {}]).state()
    for k in ("entries_total", "messages_total"):
        assert totals[k] == ref_totals[k], (k, totals[k], ref_totals[k])
    timed("capacity")
    # And `fanout verify`: the log projected into a scratch keyspace, compared table by table.
    checked = verify_views(load_settings({**d.cluster.urls, **d.cluster.settings_env}), progress=False)
    assert checked.equal, {t: diff for t, diff in checked.differences.items()}
    timed("fanout verify")
    return (
        f"verified {latest} messages x {MEMBERS} members ({len(entries)} entries, "
        f"{len(d.acked)} acknowledged) in {time.monotonic() - t0:.1f} s ("
        + ", ".join(f"{k} {v:.1f} s" for k, v in laps.items())
        + ")"
    )


# -- processes and engines -----------------------------------------------------------------------


def assignment(c: Cluster, name: str) -> tuple[int, set[int] | None]:
    """(the consumer-group generation of the worker's last logged assignment, its
    partitions); (0, None) before any. A stale line (a worker stuck in a revocation) has an
    older generation than the group's current one."""
    path = c.logs / f"{name}.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    generation = 0
    last: tuple[int, set[int] | None] = (0, None)
    for line in text.splitlines():
        if "] generation id " in line:
            generation = int(line.split("] generation id ", 1)[1].split()[0])
        elif "partitions assigned: [" in line:
            parts = line.rsplit("[", 1)[1].split("]")[0]
            last = (generation, {int(x) for x in parts.split(",") if x.strip()})
    return last


def partition_of(kafka_url: str, position: int, timeout: float = 30.0) -> int:
    """The Kafka partition holding the event record at `position` (the relay keys by
    aggregate: every event of the group is in it)."""
    from confluent_kafka import Consumer, TopicPartition

    from streams.records import EventRecord, decode

    k = kafka_settings(kafka_url)
    consumer = Consumer(
        {
            "bootstrap.servers": k.brokers,
            "group.id": "crash-test-probe",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(k.topic, p, 0) for p in range(k.partitions)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                if m.error() is None:
                    rec = decode(cast(Any, m.headers()), m.value())
                    if isinstance(rec, EventRecord) and rec.position == position:
                        return int(m.partition() or 0)
        raise AssertionError(f"no record at position {position} in {k.topic}")
    finally:
        consumer.close()


def engine_script(name: str) -> float:
    t0 = time.monotonic()
    subprocess.run(["bash", str(ENGINES_SCRIPTS / name)], check=True, stdout=subprocess.DEVNULL, timeout=300)
    return time.monotonic() - t0


def require_local_engine(engine: str, pidfile: str) -> None:
    path = ENGINES_DIR / engine / pidfile
    if not path.exists():
        pytest.fail(f"{engine} was not started by infra/engines (no {path}): cannot restart it", pytrace=False)


@dataclass
class Supervisor:
    """Restarts the relay or a worker that exited, as an operator (or systemd) would, and
    remembers it: the tests assert which processes recover by themselves."""

    cluster: Cluster
    restarted: list[str] = field(default_factory=list)

    def poll(self) -> None:
        for name, proc in list(self.cluster.procs.items()):
            if proc.poll() is not None:
                self.restarted.append(f"{name}(exit {proc.returncode})")
                self.cluster.procs.pop(name)
                self.cluster.start(name)

    def settle(self, d: Deployment, timeout: float = 240.0) -> float:
        t0 = time.monotonic()
        while not d.rt.wait_until(d.latest(), timeout=1.0):
            self.poll()
            assert time.monotonic() - t0 < timeout, f"not caught up in {timeout} s: {logs(d)}"
        return time.monotonic() - t0


# -- where a fault landed ----------------------------------------------------------------------------


def mid_fanout(d: Deployment, first: int, count: int, *, inside_a_message: bool = False) -> dict[int, float]:
    """The run's messages `first`..: the mailbox entries of each in the table (a scan: a
    member's read finds an entry only once the unit's hour rows landed too), asserted
    strictly between none and all of the run's (the fault landed in the run's fan-out), and
    with `inside_a_message` strictly between none and all members for one of them (the fault
    landed inside that message's mailbox round: a worker's fault at `commit.mailbox.part`; at a
    later step of the commit every message of the unit is whole). Returns the fraction of the
    members holding each."""
    mb: Any = d.rt.views.mailbox
    have = collections.Counter(seq for _t, _u, _pos, seq, _c, _f in mb.all_entries())
    at = {s: have[s] / MEMBERS for s in range(first, first + count)}
    assert 0 < sum(have[s] for s in at) < count * MEMBERS, f"the fault landed outside the fan-out: {fmt(at)}"
    if inside_a_message:
        assert any(0 < have[s] < MEMBERS for s in at), f"the fault landed outside a message's fan-out: {fmt(at)}"
    return at


def exited(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"pid {proc.pid} still running {timeout} s after its failpoint fired") from None


def stopped(pid: int, timeout: float = 30.0) -> None:
    """Until process `pid` is stopped (SIGSTOP by its `stop` failpoint)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, f"pid {pid} not stopped {timeout} s after its failpoint fired"
        time.sleep(0.01)


def note(d: Deployment, line: str, started: float) -> None:
    line = f"{line}; run {time.monotonic() - started:.1f} s"
    print(line, flush=True)
    d.notes.append(line)


# -- a: kill -9 of an API replica while it sends ------------------------------------------------------


class SenderProcess:
    def __init__(self, d: Deployment, tag: str, count: int, interval: float, failpoints: str) -> None:
        self.lines: list[tuple[float, str, dict[str, Any]]] = []
        self.changed = threading.Condition()
        args = [sys.executable, "-m", "tests.distributed.crash_sender", T, CID, str(count), str(interval), tag]
        assert d.fired is not None
        self.proc = subprocess.Popen(
            [*args, MENTIONED, *SENDERS],
            cwd=ROOT,
            env={**d.cluster.env(), "FANOUT_FAILPOINTS": failpoints, "FANOUT_FAILPOINTS_FIRED": str(d.fired)},
            stdout=subprocess.PIPE,
            stderr=open(d.cluster.logs / "sender.log", "ab"),  # noqa: SIM115
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            kind, _, body = raw.decode().strip().partition(" ")
            with self.changed:
                self.lines.append((time.monotonic(), kind, json.loads(body) if body else {}))
                self.changed.notify_all()

    def acked(self) -> list[dict[str, Any]]:
        return [b for _, k, b in self.lines if k == "ACK"]


@pytest.mark.parametrize(
    ("point", "stored"),
    [("command.recording", False), ("command.recorded", True)],
    ids=["before-its-transaction", "after-its-transaction"],
)
def test_a_kill_9_of_an_api_replica_while_it_sends(deployment: Deployment, point: str, stored: bool) -> None:
    """The sender dies at its second send, just before or just after the event store's
    transaction (never acknowledged either way): the message is then absent, or stored and
    delivered to every member exactly once, while the first message fans out."""
    d = deployment
    started = time.monotonic()
    first = check_run(d) + 1
    sender = SenderProcess(d, "a", PER_RUN, interval=0.0, failpoints=f"{point}=kill@MessageSent#2")
    assert d.fired_in(point) == sender.proc.pid
    assert exited(sender.proc) == -signal.SIGKILL
    sender.reader.join(10)  # the pipe drained
    acked = sender.acked()
    assert [a["i"] for a in acked] == [0], sender.lines
    d.acked |= {str(a["message_id"]) for a in acked}
    took = settle(d)
    latest = check_run(d)
    texts = {m["text"] for m in d.rt.views.messages(T, CID, 0, 10_000)}
    assert ("a message 1" in texts) is stored, (point, texts)
    assert latest == first + int(stored), (first, latest)
    note(d, f"a: sender killed at {point} of its second send; stored: {stored}; caught up {took:.1f} s later", started)
    d.notes.append(verify(d))


# -- b: kill -9 of the relay --------------------------------------------------------------------------


@pytest.mark.failpoints(relay="relay.produced=kill@MessageSent#2")
def test_b_kill_9_of_the_relay(deployment: Deployment) -> None:
    """The relay dies between producing the second message's transaction and committing it,
    while the first fans out; restarted, it publishes from where the topic stands."""
    d = deployment
    started = time.monotonic()
    first = check_run(d) + 1
    d.send("b")
    wait_fanout_started(d, first)
    d.send("b", PER_RUN - 1)
    assert d.name_of(d.fired_in("relay.produced")) == "relay"
    assert exited(d.cluster.procs["relay"]) == -signal.SIGKILL
    relayed = d.rt.links.relayed_position()
    assert relayed < d.latest(), (relayed, d.latest())  # the produced records were never committed
    at_kill = mid_fanout(d, first, PER_RUN)
    d.cluster.procs.pop("relay")
    d.cluster.start("relay")
    took = settle(d)
    latest = check_run(d)
    note(
        d,
        f"b: relay killed at relay.produced (relayed through {relayed}, log at {d.latest()}; fan-out "
        f"{fmt(at_kill)}); caught up {took:.1f} s after its restart, latest seq {latest}",
        started,
    )
    d.notes.append(verify(d))


# -- c: kill -9 of a worker, two running -------------------------------------------------------------


@pytest.mark.failpoints(worker=f"commit.{STEP}=kill@MessageSent")
def test_c_kill_9_of_a_worker_the_other_takes_over(deployment: Deployment) -> None:
    """The worker holding the conversation's partition dies in the middle of the mailbox
    round of the run's messages; the other takes the partition over and replays the unit."""
    d = deployment
    c = d.cluster
    c.start("worker-2", d.env_of("worker-2"))
    c.wait_workers(2)
    part = partition_of(c.urls["FANOUT_LOG"], d.rt.views.head(T, CID)["position"])  # type: ignore[index]
    started = time.monotonic()
    first = check_run(d) + 1
    t0 = time.monotonic()
    while True:  # the group settled: both workers assigned in the same generation, disjoint
        held = {n: assignment(c, n) for n in ("worker", "worker-2")}
        (g1, p1), (g2, p2) = held.values()
        if g1 == g2 and p1 and p2 and not p1 & p2 and part in p1 | p2:
            break
        assert time.monotonic() - t0 < 90, f"the workers did not share the partitions: {held}"
        time.sleep(0.2)
    generation = g1
    owner = next(n for n, (_, ps) in held.items() if ps and part in ps)
    d.send("c", PER_RUN)
    victim = d.name_of(d.fired_in(f"commit.{STEP}"))
    assert victim == owner, (victim, held)
    assert exited(c.procs[victim]) == -signal.SIGKILL
    killed_at = time.monotonic()
    at_kill = mid_fanout(d, first, PER_RUN, inside_a_message=True)
    other = "worker-2" if victim == "worker" else "worker"
    while True:  # the other takes the partition over after the session timeout
        g, ps = assignment(c, other)
        if g > generation and ps and part in ps:
            break
        assert time.monotonic() - killed_at < 60, f"{other} did not take partition {part}: {c.log_of(other)}"
        time.sleep(0.2)
    takeover = time.monotonic() - killed_at
    took = settle(d)
    latest = check_run(d)
    note(
        d,
        f"c: {victim} (partition {part}) killed at commit.{STEP} ({fmt(at_kill)}); {other} took the "
        f"partition over {takeover:.1f} s later and caught up {took:.1f} s after; latest seq {latest}",
        started,
    )
    d.notes.append(verify(d))


# -- d, e: Kafka or Cassandra restarted while a worker stands in the middle of a commit --------------


def restart_under_a_stopped_worker(d: Deployment, tag: str, engine: str, sup: Supervisor) -> str:
    """Send the run's messages; once the worker stopped itself in the middle of their commit
    (the `stop` failpoint), restart `engine` while it stands there (one more message accepted
    by PostgreSQL meanwhile), then let the worker go on. Returns the run's note."""
    first = check_run(d) + 1
    d.send(tag, PER_RUN - 1)
    pid = d.fired_in(f"commit.{STEP}")
    stopped(pid)
    at_stop = mid_fanout(d, first, PER_RUN, inside_a_message=True)
    try:
        down = engine_script(f"{engine}-down.sh")
        d.send(tag)  # accepted by PostgreSQL while the engine is away
    finally:
        up = engine_script(f"{engine}-up.sh")
        os.kill(pid, signal.SIGCONT)
    took = sup.settle(d)
    return (
        f"{engine} restarted under {d.name_of(pid)} stopped at commit.{STEP} ({fmt(at_stop)}), down in "
        f"{down:.1f} s, up in {up:.1f} s; caught up {took:.1f} s later; restarted: {sup.restarted or 'none'}"
    )


@pytest.mark.engine_restart
@pytest.mark.failpoints(worker=f"commit.{STEP}=stop@MessageSent")
def test_d_a_restart_of_the_kafka_broker(deployment: Deployment) -> None:
    d = deployment
    require_local_engine("kafka", "kafka.pid")
    cluster_id = (ENGINES_DIR / "kafka" / "cluster.id").read_text()
    kafka = kafka_settings(d.cluster.urls["FANOUT_LOG"])
    relayed = relayed_position(kafka.brokers, kafka.topic)
    started = time.monotonic()
    sup = Supervisor(d.cluster)
    line = restart_under_a_stopped_worker(d, "d", "kafka", sup)
    assert (ENGINES_DIR / "kafka" / "cluster.id").read_text() == cluster_id, "Kafka came back on new data"
    assert relayed_position(kafka.brokers, kafka.topic) >= relayed, "the topic lost records across the restart"
    note(d, f"d: {line}; latest seq {check_run(d)}", started)
    d.notes.append(verify(d))


@pytest.mark.engine_restart
@pytest.mark.failpoints(worker=f"commit.{STEP}=stop@MessageSent")
def test_e_a_restart_of_cassandra(deployment: Deployment) -> None:
    d = deployment
    require_local_engine("cassandra", "cassandra.pid")
    # Reconnection attempts no more than 5 s apart (the driver's default backs off to 600 s).
    views: Any = d.rt.views
    for session in (views.session, views.mailbox.session):
        assert session.cluster.reconnection_policy.max_delay <= 5.0
    started = time.monotonic()
    sup = Supervisor(d.cluster)
    line = restart_under_a_stopped_worker(d, "e", "cassandra", sup)
    reconnected(d)  # the workers caught up; this process's own sessions may still be reconnecting
    note(d, f"e: {line}; latest seq {check_run(d)}", started)
    d.notes.append(verify(d))
