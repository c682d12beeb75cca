"""The three-node cluster of `make cluster-up` (infra/cluster/, ADR-0027) for tests/cluster/.

`engines` here names the cluster's URLs ($FANOUT_CLUSTER_DIR/cluster.env, default
/tmp/fanout-cluster), so the `fresh_*` fixtures of tests/engines.py and the crash-test
deployment of tests/distributed/test_crash.py run on it unchanged. The cluster is not started
here: `make test-cluster` starts it, runs these tests and stops it. A cluster that is not up
FAILS every test with what to run, never a skip.

These tests are marked `cluster` and run only when selected (`-m cluster`, as `make
test-cluster` does): `make test` deselects them, since they need the cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = Path(os.environ.get("FANOUT_CLUSTER_DIR", "/tmp/fanout-cluster"))
SCRIPTS = ROOT / "infra" / "cluster"
NODES = (1, 2, 3)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "cluster" in (config.option.markexpr or ""):
        return
    here = Path(__file__).parent
    chosen = [i for i in items if here not in Path(str(i.path)).parents]
    if len(chosen) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in chosen])
        items[:] = chosen


def read_cluster_env() -> dict[str, str]:
    path = CLUSTER_DIR / "cluster.env"
    if not path.exists():
        pytest.fail(f"no three-node cluster: {path} is missing (run `make cluster-up`)", pytrace=False)
    urls = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            urls[k] = v
    return urls


def unreachable(urls: dict[str, str]) -> list[str]:
    """host:port of every engine address in the URLs that refuses a TCP connection."""
    bad = []
    for url in urls.values():
        netloc = urlsplit(url).netloc.rsplit("@", 1)[-1]
        for hp in netloc.split(","):
            host, _, port = hp.rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=2.0):
                    pass
            except OSError:
                bad.append(hp)
    return bad


@pytest.fixture(scope="session")
def engines() -> Iterator[dict[str, str]]:
    """FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS of the running three-node cluster."""
    urls = read_cluster_env()
    bad = unreachable(urls)
    if bad:
        pytest.fail(f"the three-node cluster does not answer at {bad} (run `make cluster-up`)", pytrace=False)
    yield urls


def node(engine: str, n: int, command: str, timeout: float = 300.0) -> float:
    """infra/cluster/{cassandra,kafka}-node.sh N start|stop|kill; returns the seconds it took."""
    t0 = time.monotonic()
    subprocess.run(
        ["bash", str(SCRIPTS / f"{engine}-node.sh"), str(n), command],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if command != "start" else None,
        timeout=timeout,
    )
    return time.monotonic() - t0


def running(engine: str, n: int) -> bool:
    return (
        subprocess.run(["bash", str(SCRIPTS / f"{engine}-node.sh"), str(n), "pid"], capture_output=True).returncode
        == 0
    )


@pytest.fixture(autouse=True)
def whole_cluster(engines: dict[str, str]) -> Iterator[None]:
    """Every node up before a test and after it (a test that failed mid-loss leaves none down)."""

    def restore() -> None:
        for engine in ("kafka", "cassandra"):
            for n in NODES:
                if not running(engine, n):
                    node(engine, n, "start")

    restore()
    try:
        yield
    finally:
        restore()
