"""Operators read one line: a distributed command whose engine URL is bad or
whose engine does not answer at start-up prints one line `fanout: error: ...` naming the URL
(never its password) and what to do, and exits 2: `fanout worker` (it printed a traceback and
exited 1), `python -m cli.worker`, `fanout serve`. No engine is needed: a closed port stands
for a server that is down (tests/distributed/test_operator_lines.py has a missing database on
the real PostgreSQL and Kafka going away)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECRET_PASSWORD = "hunter2-secret"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


def run(args: list[str], tmp_path: Path, **urls: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    env.update(urls, FANOUT_SECRET="s" * 40, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The whole output is one `fanout: error:` line, exit 2, no traceback."""
    out = done.stdout + done.stderr
    lines = [line for line in out.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, out)
    assert "Traceback" not in out, out
    assert len(lines) == 1 and lines[0].startswith("fanout: error: "), out
    assert SECRET_PASSWORD not in out, out
    return lines[0]


COMMANDS = {
    "fanout worker": ["cli.main", "worker"],
    "python -m cli.worker": ["cli.worker"],
    "fanout serve": ["cli.main", "serve", "--port", "0"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_event_store_that_does_not_answer_is_one_line_naming_the_url(command: str, tmp_path: Path) -> None:
    port = closed_port()
    done = run(
        [*COMMANDS[command], "--data-dir", str(tmp_path)],
        tmp_path,
        FANOUT_EVENT_STORE=f"postgresql://fanout:{SECRET_PASSWORD}@127.0.0.1:{port}/events",
        FANOUT_LOG=f"kafka://127.0.0.1:{closed_port()}",
        FANOUT_VIEWS=f"cassandra://127.0.0.1:{closed_port()}/views",
    )
    line = one_line(done)
    assert f"postgresql://fanout@127.0.0.1:{port}/events" in line, line
    assert "does not answer" in line and "start it" in line, line


@pytest.mark.parametrize("command", ["fanout worker", "python -m cli.worker"])
def test_a_bad_log_url_is_one_line(command: str, tmp_path: Path) -> None:
    done = run(
        [*COMMANDS[command], "--data-dir", str(tmp_path)],
        tmp_path,
        FANOUT_EVENT_STORE="postgresql://fanout@127.0.0.1:5432/events",
        FANOUT_LOG="kafka:/nohost",
        FANOUT_VIEWS="cassandra://127.0.0.1:9042/views",
    )
    assert "FANOUT_LOG" in one_line(done)
