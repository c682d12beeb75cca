"""A Cassandra crash heals itself (ADR-0021), on the real engines.

Cassandra runs here with `commitlog_sync: periodic` (acknowledged writes are fsynced every
10 s), the setting under which a kill -9 of the node loses the last seconds of writes it
had acknowledged: the units of work a worker committed, tracking included, can vanish. The
worker holds those positions in memory; before the fix it went on past the hole and the
views stayed wrong (found by fault injection: 3 of 384 acknowledged messages missing, 143 of
280 mailboxes short an entry). Now the worker finds the views behind what it committed,
reloads, and reads the log again from the offset kept with the tracking.

A burst of sends to a 200-member group at ~8 messages/s; Cassandra is killed with SIGKILL
twice during it (KILLS) and started again. Then every acknowledged message is in the
conversation's history and in every member's mailbox exactly once, unread counts are exact,
and `fanout verify` finds no difference. Cassandra is started again with the project's
default (durable) commit log at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.errors import FanoutError
from fanout.config import load_settings
from streams.routing import conversation_partition
from tests.distributed.cluster import ROOT, Cluster, cluster_for
from tests.engines import FRESH_PARTITIONS
from tools.rebuild import verify as verify_views

pytestmark = [pytest.mark.slow, pytest.mark.engine_restart]

T = "acme"
CID = "crashy"
MEMBERS = [f"m{i:03d}" for i in range(200)]
KILLS = 2  # each a kill -9 mid-burst; the heal itself is made certain by the test after
RATE = 8.0  # sends per second
MAX_SENDS = 900  # one mailbox page (1,000) holds them all
ENGINES_DIR = Path(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines"))
SCRIPTS = ROOT / "infra" / "engines"
# the first heal of the conversation's partition is cut short right after it
CUT_SHORT = f"take.resumed=fail@healed-p{conversation_partition(T, CID, FRESH_PARTITIONS)}"
SETTINGS = {
    "FANOUT_PER_SENDER_IN_CONVERSATION_RATE": "1000/s",
    "FANOUT_PER_CONVERSATION_MSG_RATE": "1000/1000/1000",
}


def cassandra_up(commitlog: str | None = None) -> float:
    env = dict(os.environ)
    if commitlog is not None:
        env["FANOUT_ENGINES_CASSANDRA_COMMITLOG"] = commitlog
    t0 = time.monotonic()
    subprocess.run(
        ["bash", str(SCRIPTS / "cassandra-up.sh")], check=True, stdout=subprocess.DEVNULL, env=env, timeout=300
    )
    return time.monotonic() - t0


def cassandra_kill_9() -> None:
    pidfile = ENGINES_DIR / "cassandra" / "cassandra.pid"
    if not pidfile.exists():
        pytest.fail(f"Cassandra was not started by infra/engines (no {pidfile}): cannot kill it", pytrace=False)
    pid = int(pidfile.read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def cassandra_restart(commitlog: str | None = None) -> float:
    subprocess.run(["bash", str(SCRIPTS / "cassandra-down.sh")], check=True, stdout=subprocess.DEVNULL, timeout=120)
    return cassandra_up(commitlog)


@pytest.fixture
def periodic_cassandra(engines: dict[str, str]) -> Iterator[None]:
    cassandra_restart("periodic")
    try:
        yield
    finally:
        cassandra_restart()  # the default, durable


def views_position(rt: Any, timeout: float = 60.0) -> int:
    """The views' position, once this replica's sessions (views and mailbox) have
    reconnected: a request on a connection the restart killed fails once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rt.views.mailbox_page(T, MEMBERS[0], 0, 1)
            return int(rt.views.views_position("delivery"))
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Burst:
    """Sends at RATE from a thread until stopped; remembers what was acknowledged."""

    def __init__(self, c: Cluster) -> None:
        self.rt = c.runtimes[0]
        self.acked: dict[int, str] = {}  # seq -> message id
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set() and len(self.acked) < MAX_SENDS:
            try:
                r = self.rt.app.send_message(T, CID, sender=MEMBERS[i % 3], text=f"burst {i}", client_msg_id=f"b{i}")
                self.acked[int(r["conversation_seq"])] = str(r["message_id"])
                i += 1
            except FanoutError:
                self.refused += 1  # refused explicitly (views away: backpressure); nothing written
            self._stop.wait(1.0 / RATE)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def cluster(fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path) -> Iterator[Cluster]:
    """A replica, the relay and one worker on a namespace of their own, the group created."""
    c = cluster_for(
        {"FANOUT_EVENT_STORE": fresh_postgres, "FANOUT_LOG": fresh_kafka, "FANOUT_VIEWS": fresh_cassandra},
        tmp_path / "logs",
        **SETTINGS,
    )
    try:
        rt = c.replica()
        c.start("relay")
        # the first heal of the conversation's partition is cut short by a failure right after
        # it (what a request on a connection the restart killed does): the retry must heal again
        c.start("worker", env={"FANOUT_FAILPOINTS": CUT_SHORT})
        rt.app.create_conversation(T, CID, "crash", MEMBERS)
        c.wait_workers(1)
        c.settle(rt, timeout=120)
        yield c
    finally:
        c.close(signal.SIGKILL)


def test_kill_9_of_cassandra_during_a_burst_loses_no_acknowledged_message(
    periodic_cassandra: None, cluster: Cluster
) -> None:
    c, rt = cluster, cluster.runtimes[0]
    burst = Burst(c)
    downs = []
    try:
        for _ in range(KILLS):
            time.sleep(4.0)  # units acknowledged within the last 10 s are at risk
            cassandra_kill_9()
            downs.append(cassandra_up("periodic"))
    finally:
        time.sleep(3.0)
        burst.stop()
    deadline = time.monotonic() + 240
    while not rt.wait_until(rt.app.log_position(), timeout=2.0):
        dead = [n for n, p in c.procs.items() if p.poll() is not None]
        assert not dead, f"{dead} exited: {c.log_of(dead[0])}"
        assert time.monotonic() < deadline, f"not caught up: {c.log_of('worker')}"
    views_position(rt)
    acked = burst.acked
    assert len(acked) > 20, f"only {len(acked)} sends acknowledged ({burst.refused} refused)"
    top = max(acked)
    history = {m["conversation_seq"]: m["message_id"] for m in rt.views.messages(T, CID, 0, 10_000)}
    missing = {s: m for s, m in acked.items() if history.get(s) != m}
    if missing:  # what the next one to see it needs (seen once on 2026-12-06, cause not found)
        near = {q: history.get(q) for s in missing for q in range(s - 2, s + 3)}
        pytest.fail(
            f"acknowledged but not in the history: {missing}; the history around them: {near}; "
            f"head {rt.views.head(T, CID)}; the worker's log:\n{c.log_of('worker')}"
        )
    short = {}
    for u in MEMBERS:
        entries = rt.queries.mailbox(T, u, 0, 1000)["entries"]
        seqs = [e["conversation_seq"] for e in entries if e["conversation_id"] == CID]
        if sorted(seqs) != list(range(1, top + 1)):
            short[u] = sorted(set(range(1, top + 1)) - set(seqs))[:5]
    assert not short, f"{len(short)} of {len(MEMBERS)} mailboxes wrong, e.g. {list(short.items())[:3]}"
    session = next(s for s in rt.queries.session_list(T, MEMBERS[-1])[0] if s["conversation_id"] == CID)
    assert session["unread_count"] == top and session["latest_conversation_seq"] == top, session
    checked = verify_views(load_settings({**c.urls, **c.settings_env}), progress=False)
    assert checked.equal, {t: d for t, d in checked.differences.items()}
    log = (c.logs / "worker.log").read_text(errors="replace")
    heals = log.count("they lost acknowledged writes")
    print(
        f"\n{KILLS} kill -9 of Cassandra (up again in {', '.join(f'{d:.0f}' for d in downs)} s): "
        f"{len(acked)} acknowledged, {burst.refused} refused; the worker found lost writes {heals} time(s) "
        f"and re-read {log.count('records again')} ranges; every mailbox and `fanout verify` exact",
        flush=True,
    )


def test_views_that_lost_acknowledged_writes_are_healed_from_the_log(cluster: Cluster, tmp_path: Path) -> None:
    """The loss itself, made certain: Cassandra's data is copied while it is stopped, the
    worker projects twenty more messages, then the node is killed and comes back with the copy
    (what a crash losing the last seconds of acknowledged writes leaves, e.g. on a machine
    crash with a periodic commit log). The worker finds the views behind what it committed and
    reads the log again from their positions; nothing is lost. The first heal of the
    conversation's partition N is cut short by a failure injected right after it
    (`take.resumed=fail@healed-p<N>`, what a request on a connection the restart killed does):
    the retry heals again (ADR-0021 3a)."""
    import shutil

    data = ENGINES_DIR / "cassandra" / "data"
    backup = tmp_path / "cassandra-data"
    c, rt = cluster, cluster.runtimes[0]
    for i in range(10):
        rt.app.send_message(T, CID, sender=MEMBERS[0], text=f"kept {i}", client_msg_id=f"k{i}")
    c.settle(rt, timeout=120)
    kept = rt.position()
    subprocess.run(["bash", str(SCRIPTS / "cassandra-down.sh")], check=True, stdout=subprocess.DEVNULL, timeout=120)
    shutil.copytree(data, backup, symlinks=True)
    cassandra_up()
    for i in range(20):
        rt.app.send_message(T, CID, sender=MEMBERS[1], text=f"lost {i}", client_msg_id=f"l{i}")
    c.settle(rt, timeout=180)
    cassandra_kill_9()
    shutil.rmtree(data)
    shutil.copytree(backup, data, symlinks=True)
    cassandra_up()
    assert views_position(rt) <= kept  # the views went back: 20 messages lost
    for i in range(5):
        rt.app.send_message(T, CID, sender=MEMBERS[2], text=f"after {i}", client_msg_id=f"a{i}")
    deadline = time.monotonic() + 180
    while not rt.wait_until(rt.app.log_position(), timeout=2.0):
        assert time.monotonic() < deadline, f"not caught up: {c.log_of('worker')}"
    top = 35
    views_position(rt)  # the replica's sessions answer again (a first request may meet a dead connection)
    for u in MEMBERS:
        seqs = [e["conversation_seq"] for e in rt.queries.mailbox(T, u, 0, 1000)["entries"]]
        assert seqs == list(range(1, top + 1)), (u, sorted(set(range(1, top + 1)) - set(seqs))[:5])
    head = rt.views.head(T, CID)
    assert head is not None and head["latest_conversation_seq"] == top
    checked = verify_views(load_settings({**c.urls, **c.settings_env}), progress=False)
    assert checked.equal, {t: d for t, d in checked.differences.items()}
    log = (c.logs / "worker.log").read_text(errors="replace")
    assert "they lost acknowledged writes" in log, log[-3000:]
    assert "records again" in log and "Traceback" not in log, log[-3000:]
    # the first heal was cut short by the failpoint, and the retry healed again
    assert "failpoint take.resumed: fail" in log and log.count("they lost acknowledged writes") >= 2, log[-3000:]
