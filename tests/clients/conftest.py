"""The Python SDK (clients/python) against a real `fanout serve` of the embedded runtime: a
subprocess on a free loopback port over a temporary data dir, with the e2e suite's secret
and fast parameters (tests/e2e/conftest.py), restartable on the same port and data dir. The
test side talks to it with the e2e API-client helper; the SDK under test is fanout_client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from domain.params import Parameters
from tests.e2e.conftest import FAST, SECRET, Api, params_env
from tests.integration.test_cli import REPO, clean_env, free_port


class ServeProcess:
    """`fanout serve` as a subprocess; `url` stays the same across restart()."""

    def __init__(self, data_dir: Path, params: Parameters = FAST) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = clean_env(FANOUT_SECRET=SECRET, **params_env(params))
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> ServeProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--data-dir", str(self.data_dir), "--port", str(self.port)],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"fanout serve exited {self.proc.returncode}: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "fanout serve was not ready in 60 s"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path_factory.mktemp("serve") / "data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def api(served: ServeProcess) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, served)  # type: ignore[arg-type]  # Api needs only `.url`


def sdk_env() -> dict[str, str]:
    """The environment of a `fanout-client` subprocess (the console script of .venv)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
