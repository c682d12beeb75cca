"""Operators read one line, not a flood, on the real engines.

* A missing database: `fanout worker`, `python -m cli.worker` and `fanout serve` print one line
  naming the URL (without its password) and how to create the database, and exit 2 (before:
  `fanout worker` printed a traceback and exited 1; both worker commands said only "couldn't get
  a connection after 5.00 sec").
* Kafka not answering when a worker starts: one line, exit 2, none of librdkafka's lines.
* Kafka going away under a running worker and replica: a Kafka broker of the test's own (the
  project's infra/engines/kafka-up.sh on free ports; the shared one is never stopped) is killed
  for 10 s, then started again. Before, the worker logged about 730 lines in those 10 s (aiokafka's
  ERROR per attempt, librdkafka's FAIL lines) and the replica about 195; now each says "Kafka
  unreachable at ..." once, and "Kafka reachable again at ... after N s" once it is back."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import unique, with_path, with_query

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "hunter2-secret"


def env_with(**urls: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_") or k.startswith("FANOUT_ENGINES")}
    env.update(urls, FANOUT_SECRET="s" * 40, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return env


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    out = done.stdout + done.stderr
    lines = [line for line in out.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, out)
    assert "Traceback" not in out and "rdkafka" not in out, out
    assert len(lines) == 1 and lines[0].startswith("fanout: error: "), out
    assert PASSWORD not in out, out
    return lines[0]


@pytest.mark.parametrize(
    "command", [["cli.main", "worker"], ["cli.worker"], ["cli.main", "serve", "--port", "0"]], ids=" ".join
)
def test_a_missing_database_is_one_line_saying_how_to_create_it(
    command: list[str], engines: dict[str, str], tmp_path: Path
) -> None:
    name = unique("missing")
    url = with_path(engines["FANOUT_EVENT_STORE"], name).replace(
        "postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@"
    )
    done = subprocess.run(
        [sys.executable, "-m", *command, "--data-dir", str(tmp_path)],
        cwd=ROOT,
        env=env_with(FANOUT_EVENT_STORE=url, FANOUT_LOG=engines["FANOUT_LOG"], FANOUT_VIEWS=engines["FANOUT_VIEWS"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_line(done)
    assert f"the database '{name}' does not exist at postgresql://postgres@127.0.0.1:" in line, line
    assert f"createdb -h 127.0.0.1 -p {with_port(url)} -U postgres {name}" in line, line


def with_port(url: str) -> int:
    from urllib.parse import urlsplit

    return urlsplit(url).port or 5432


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kafka_not_answering_when_a_worker_starts_is_one_line(fresh_postgres: str, tmp_path: Path) -> None:
    port = free_port()  # closed: nothing listens
    done = subprocess.run(
        [sys.executable, "-m", "cli.worker", "--data-dir", str(tmp_path)],
        cwd=ROOT,
        env=env_with(FANOUT_EVENT_STORE=fresh_postgres, FANOUT_LOG=f"kafka://127.0.0.1:{port}", FANOUT_VIEWS="sqlite"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_line(done)
    assert f"FANOUT_LOG: Kafka at 127.0.0.1:{port} does not answer" in line, line


# -- Kafka going away under running processes ------------------------------------------------


class PrivateKafka:
    """A single-node broker of this test (infra/engines/kafka-up.sh in its own folder and
    ports), stopped with SIGKILL and started again on the same data."""

    def __init__(self, folder: Path) -> None:
        self.env = {
            **os.environ,
            "FANOUT_ENGINES_DIR": str(folder),
            "FANOUT_ENGINES_KAFKA_PORT": str(free_port()),
            "FANOUT_ENGINES_KAFKA_CONTROLLER_PORT": str(free_port()),
        }
        self.brokers = f"127.0.0.1:{self.env['FANOUT_ENGINES_KAFKA_PORT']}"
        self.pidfile = folder / "kafka" / "kafka.pid"

    def up(self) -> None:
        done = subprocess.run(
            [str(ROOT / "infra/engines/kafka-up.sh")], env=self.env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"the test's Kafka did not start: {done.stderr[-2000:]}"

    def kill(self) -> None:
        os.kill(int(self.pidfile.read_text().strip()), signal.SIGKILL)

    def down(self) -> None:
        subprocess.run(
            [str(ROOT / "infra/engines/kafka-down.sh"), "--wipe"], env=self.env, capture_output=True, timeout=60
        )


@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[PrivateKafka]:
    kafka = PrivateKafka(tmp_path / "engines")
    kafka.up()
    try:
        yield kafka
    finally:
        kafka.down()


class Proc:
    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.path = logs / f"{name}.log"
        out = open(self.path, "ab")  # noqa: SIM115 (owned by the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )

    def text(self) -> str:
        return self.path.read_text(errors="replace")

    def lines(self) -> list[str]:
        return [line for line in self.text().splitlines() if line.strip()]

    def wait_for(self, pattern: str, timeout: float, since: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, "\n".join(self.lines()[since:])):
            assert self.proc.poll() is None, f"{self.path.name} exited: {self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} in {timeout} s: {self.text()[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


DOWN = 10.0  # seconds Kafka stays away
MOST_LINES = 4  # a process may write while Kafka is away (the state line, the odd client line)


@pytest.mark.slow
def test_kafka_away_is_one_line_and_back_one_line_not_a_flood(
    private_kafka: PrivateKafka, fresh_postgres: str, fresh_cassandra: str, tmp_path: Path
) -> None:
    topic = unique("t")
    log = with_query(f"kafka://{private_kafka.brokers}", topic=topic, partitions=2)
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = Proc(
        "worker",
        ["cli.worker", "--data-dir", str(tmp_path / "worker")],
        env_with(FANOUT_EVENT_STORE=fresh_postgres, FANOUT_LOG=log, FANOUT_VIEWS="sqlite"),
        logs,
    )
    replica = Proc(
        "replica",
        ["cli.main", "serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "replica")],
        env_with(FANOUT_EVENT_STORE=fresh_postgres, FANOUT_LOG=log, FANOUT_VIEWS=fresh_cassandra),
        logs,
    )
    try:
        worker.wait_for(r"partitions assigned: \[0, 1\]", 120)
        replica.wait_for(r"fanout: serving http", 120)
        time.sleep(3.0)  # the replica's health check has read the relayed position (every 2 s)
        before = {p: len(p.lines()) for p in (worker, replica)}
        private_kafka.kill()
        time.sleep(DOWN)
        during = {p: p.lines()[before[p] :] for p in (worker, replica)}
        after = {p: len(p.lines()) for p in (worker, replica)}
        private_kafka.up()
        for p in (worker, replica):
            p.wait_for(rf"Kafka reachable again at {re.escape(private_kafka.brokers)} after [0-9.]+ s", 60, before[p])
        for p, lines in during.items():
            text = "\n".join(lines)
            assert len(lines) <= MOST_LINES, f"{p.path.name} wrote {len(lines)} lines in {DOWN:.0f} s:\n{text[-3000:]}"
            assert f"Kafka unreachable at {private_kafka.brokers}" in text, f"{p.path.name}: {text}"
        for p in (worker, replica):
            back = p.lines()[after[p] :]
            assert len(back) <= 30, f"{p.path.name} after Kafka came back:\n" + "\n".join(back)[-3000:]
    finally:
        worker.stop()
        replica.stop()
