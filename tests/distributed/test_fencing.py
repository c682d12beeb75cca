"""A stale writer never overwrites newer views (ADR-0021), on the real engines.

The case found by fault injection: worker A owns the partition of a large conversation Z and
is paused (a GC pause, a VM stall: SIGSTOP) in the middle of a unit of work; after the
session timeout worker B takes the partition over and projects that message and later
ones; then A continues and finishes its unit. Before the fix A's commit overwrote B's newer
rows: Z's head went back, members' read state and sessions went back, the tracking went
back (so the mailbox cursor, bounded by it, hid entries it had served) and `fanout verify`
failed for good.

Here A stops itself at a named step of its commit (projections/failpoints.py:
FANOUT_FAILPOINTS=commit.<step>=stop@<event kind>#<n>), which is a real SIGSTOP at an exact
place, so each variant is the same interleaving every run:

* `rows`: after the message's mailbox entries, before its states and delivery record;
* `heads`: between the member rows and the head;
* `tracking`: between the head and the tracking;
* the same pause in a membership change (a join, a leave) instead of a send.

While it runs a sampler reads every tracking position and a member's mailbox a few times a
second: no position may ever go back, and an entry the mailbox has served may never
disappear. At the end every view equals a clean replay (`fanout verify`), Z's head and a
member's session are right, and A's log names the fenced unit in one line (no traceback)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from api.metrics import Metrics
from fanout.config import load_settings
from fanout.distributed import DistributedRuntime
from tests.distributed.cluster import Cluster, cluster_for
from tools.rebuild import verify as verify_views

pytestmark = pytest.mark.slow

T = "acme"
Z = "zed"
MEMBERS = [f"u{i:05d}" for i in range(3000)]
READER = MEMBERS[7]  # whose session and mailbox are checked
SETTINGS = {
    "FANOUT_PER_SENDER_IN_CONVERSATION_RATE": "1000/s",
    "FANOUT_PER_CONVERSATION_MSG_RATE": "1000/1000/1000",
}


@dataclass
class Sampler:
    """Reads the tracking positions and READER's mailbox every 50 ms; records any step back."""

    rt: DistributedRuntime
    went_back: list[str] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        positions: dict[tuple[str, int], int] = {}
        served: set[int] = set()
        while not self._stop.is_set():
            try:
                now = self.rt.views.positions()
                cursors = {e["cursor"] for e in self.rt.queries.mailbox(T, READER, 0, 1000)["entries"]}
            except Exception:  # an engine busy for a moment: try again
                time.sleep(0.05)
                continue
            for key, pos in now.items():
                if pos < positions.get(key, 0):
                    self.went_back.append(f"tracking {key} went back {positions[key]} -> {pos}")
            positions.update(now)
            if served - cursors:
                self.went_back.append(f"mailbox of {READER} hid {sorted(served - cursors)} it had served")
            served |= cursors
            self.samples += 1
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


@pytest.fixture
def cluster(fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path) -> Iterator[Cluster]:
    c = cluster_for(
        {"FANOUT_EVENT_STORE": fresh_postgres, "FANOUT_LOG": fresh_kafka, "FANOUT_VIEWS": fresh_cassandra},
        tmp_path / "logs",
        **SETTINGS,
    )
    try:
        yield c
    finally:
        c.close(signal.SIGKILL)


def wait_for(what: str, check: Any, timeout: float, c: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s: " + "; ".join(
            f"{n}: {c.log_of(n)[-1500:]}" for n in c.procs
        )
        time.sleep(0.1)


def stopped(c: Cluster, name: str) -> bool:
    """The process stopped itself (state T in /proc)."""
    stat = Path(f"/proc/{c.procs[name].pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def fenced_units(rt: DistributedRuntime) -> float:
    text = Metrics(rt).render().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("fanout_host_fenced_units_total{"))


def wait_fenced(rt: DistributedRuntime, c: Cluster) -> float:
    """Until /metrics counts A's fenced unit (the workers' heartbeats carry the counts). A woken
    process may first wait out a request on a connection that died while it was stopped (the
    driver's request timeout, adapters/cassandra/connect.py TIMEOUT = 30 s) before its check
    reads the partition's position: one run in eighteen showed no count after 10 s."""
    deadline = time.monotonic() + 45
    while (fenced := fenced_units(rt)) < 1:
        if time.monotonic() >= deadline:
            log_a = (c.logs / "worker-a.log").read_text(errors="replace")
            raise AssertionError(Metrics(rt).render().decode()[-2000:] + "\n--- worker A:\n" + log_a[-4000:])
        time.sleep(0.5)
    return fenced


def run_case(c: Cluster, failpoint: str, change: str) -> str:
    """One run: A pauses at `failpoint` in the unit of `change` (send / join / leave), B takes
    over, three more messages, A continues; then the checks of the module docstring."""
    rt = c.replica()
    c.start("relay")
    rt.app.create_conversation(T, Z, "fencing", MEMBERS[:-1])
    c.start("worker-a", env={"FANOUT_FAILPOINTS": failpoint})
    c.wait_workers(1)
    c.settle(rt, timeout=120)
    sampler = Sampler(rt).start()
    try:
        rt.app.send_message(T, Z, sender=MEMBERS[1], text="m0", client_msg_id="m0")
        c.settle(rt, timeout=60)
        # the unit A stops in
        if change == "send":
            rt.app.send_message(T, Z, sender=MEMBERS[1], text="m1", mentions=[READER], client_msg_id="m1")
        elif change == "join":
            rt.app.add_members(T, Z, MEMBERS[-1:])
        else:
            rt.app.remove_member(T, Z, MEMBERS[2])
        wait_for("worker A stopping at its failpoint", lambda: stopped(c, "worker-a"), 60, c)
        c.start("worker-b")  # takes the partitions over once A's session times out
        for i in range(2, 5):
            rt.app.send_message(T, Z, sender=MEMBERS[3], text=f"m{i}", client_msg_id=f"m{i}")
        c.settle(rt, timeout=120)
        before = rt.queries.session_list(T, READER)[0][0]
        c.resume("worker-a")  # A finishes (or abandons) its unit over B's newer rows
        fenced = wait_fenced(rt, c)  # A's unit is over: what it wrote, if anything, has landed
        rt.app.send_message(T, Z, sender=MEMBERS[3], text="m5", client_msg_id="m5")
        c.settle(rt, timeout=120)
    finally:
        sampler.stop()
    assert not sampler.went_back, sampler.went_back
    assert sampler.samples > 20
    seqs = 6 if change == "send" else 5  # m0, (m1), m2-m4, m5
    head = rt.views.head(T, Z)
    assert head is not None and head["latest_conversation_seq"] == seqs, head
    session = next(s for s in rt.queries.session_list(T, READER)[0] if s["conversation_id"] == Z)
    assert session["latest_conversation_seq"] == seqs and session["unread_count"] == seqs, session
    assert before["latest_conversation_seq"] == seqs - 1
    mailbox = [e["conversation_seq"] for e in rt.queries.mailbox(T, READER, 0, 100)["entries"]]
    assert mailbox == list(range(1, seqs + 1)), mailbox
    checked = verify_views(load_settings({**c.urls, **c.settings_env}), progress=False)
    assert checked.equal, {t: d for t, d in checked.differences.items()}
    log_a = (c.logs / "worker-a.log").read_text(errors="replace")
    assert "failpoint" in log_a, log_a
    assert "Traceback" not in log_a, log_a
    lines = [line for line in log_a.splitlines() if "another worker" in line]
    return (
        f"{failpoint}: {len(lines)} fenced line(s) in A's log, /metrics fenced {fenced:.0f}, "
        f"{sampler.samples} samples, verify equal"
    )


VARIANTS = [
    ("commit.rows=stop@MessageSent#2", "send"),  # the second send: m1 (m0 is projected first)
    ("commit.heads=stop@MessageSent#2", "send"),
    ("commit.tracking=stop@MessageSent#2", "send"),
    ("commit.heads=stop@MembersJoined#2", "join"),  # the first: the members of the creation
    ("commit.tracking=stop@MemberLeft", "leave"),
]


# Each variant once: the pause is at a named step, so a second run would only re-roll timing.
@pytest.mark.parametrize(("failpoint", "change"), VARIANTS, ids=[f"{v[1]}-{v[0].split('=')[0]}" for v in VARIANTS])
def test_a_paused_worker_that_wakes_after_a_takeover_never_overwrites_newer_views(
    cluster: Cluster, failpoint: str, change: str
) -> None:
    print("\n" + run_case(cluster, failpoint, change), flush=True)
