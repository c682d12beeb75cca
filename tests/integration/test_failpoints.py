"""A `stop` failpoint stops the process AT its step, whichever thread reaches it.

The fencing tests (tests/distributed/test_fencing.py) pause a worker between two steps of a
commit. The worker's commits run on an executor thread while the main thread runs the event
loop; a process-directed SIGSTOP is taken by the main thread, and the executor thread ran on
past the step (a whole commit, under load) before the stop reached it, so one run in a few
paused after the commit instead of inside it (CI saw the fencing test find nothing to fence).
Here a worker thread hits the point and then writes a marker file: while the process is
stopped the marker must not exist, each of many runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = r"""
import sys, threading, time
from pathlib import Path
from projections import failpoints

marker = Path(sys.argv[1])

def unit() -> None:
    failpoints.hit("commit.tracking", {"MessageSent"})
    marker.write_text("ran past the failpoint")

t = threading.Thread(target=unit)
t.start()
while t.is_alive():  # the main thread stays busy, as an event loop would
    sum(range(1000))
"""

RUNS = 25


def stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def test_a_stop_failpoint_stops_the_process_before_the_thread_that_hit_it_goes_on(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "FANOUT_FAILPOINTS": "commit.tracking=stop@MessageSent", "PYTHONPATH": str(root)}
    for run in range(RUNS):
        marker = tmp_path / f"marker-{run}"
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], env=env)
        try:
            deadline = time.monotonic() + 30
            while not stopped(child.pid):
                assert child.poll() is None, f"run {run}: the child exited instead of stopping"
                assert time.monotonic() < deadline, f"run {run}: the child never stopped"
                time.sleep(0.005)
            time.sleep(0.05)  # had the thread run on, it would have written by now
            assert not marker.exists(), f"run {run}: the thread ran past its failpoint before the process stopped"
            os.kill(child.pid, signal.SIGCONT)
            assert child.wait(30) == 0
            assert marker.read_text() == "ran past the failpoint"
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_a_fail_failpoint_raises_once_at_its_nth_labelled_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    from projections import failpoints

    monkeypatch.setattr(failpoints, "_points", None)
    monkeypatch.setattr(failpoints, "_hits", {})
    monkeypatch.setenv(failpoints.ENV, "take.resumed=fail@healed#2")
    failpoints.hit("take.resumed", ())  # not labelled: not counted
    failpoints.hit("take.resumed", ("healed",))  # the first labelled hit
    with pytest.raises(ConnectionError, match="failpoint take.resumed: an injected failure"):
        failpoints.hit("take.resumed", ("healed",))
    failpoints.hit("take.resumed", ("healed",))  # once
    monkeypatch.setattr(failpoints, "_points", None)
    monkeypatch.setenv(failpoints.ENV, "take.resumed=crash")
    with pytest.raises(ValueError, match="known: stop, kill, fail"):
        failpoints.hit("take.resumed")


def test_a_kill_failpoint_kills_the_process_at_its_step(tmp_path: Path) -> None:
    """kill -9 at a named step: the thread that hit it never runs past it."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "FANOUT_FAILPOINTS": "commit.tracking=kill@MessageSent", "PYTHONPATH": str(root)}
    marker = tmp_path / "marker"
    child = subprocess.run([sys.executable, "-c", CHILD, str(marker)], env=env, timeout=60, capture_output=True)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert b"failpoint commit.tracking: kill" in child.stderr
    assert not marker.exists()


def test_with_a_fired_directory_only_the_first_process_to_get_there_fires(tmp_path: Path) -> None:
    """Two workers started alike: the one that takes over after the first was killed at the
    point runs past it; the file the first one made names it."""
    root = Path(__file__).resolve().parents[2]
    fired = tmp_path / "fired"
    fired.mkdir()
    env = {
        **os.environ,
        "FANOUT_FAILPOINTS": "commit.tracking=kill@MessageSent",
        "FANOUT_FAILPOINTS_FIRED": str(fired),
        "PYTHONPATH": str(root),
    }
    first = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "m1")], env=env, timeout=60)
    second = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "m2")], env=env, timeout=60)
    assert first.returncode == -signal.SIGKILL and not (tmp_path / "m1").exists()
    assert second.returncode == 0 and (tmp_path / "m2").read_text() == "ran past the failpoint"
    assert (fired / "commit.tracking").read_text().isdigit()
