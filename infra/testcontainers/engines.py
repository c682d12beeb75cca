"""The distributed runtime's three engines as Docker containers, for machines with a Docker engine.

NOT TESTED: it was written on a machine without a Docker engine, where it cannot run. It follows
the `testcontainers` 4.15 API as installed by `make install-distributed` (source read, not run).
The local scripts in infra/engines/ are the tested path; see docs/ENGINES.md and ADR-0011.

One setting selects the engines, for scripts and the test fixtures (tests/engines.py):

    FANOUT_ENGINES=local           (default) infra/engines/up.sh: jars from Maven Central + OS PostgreSQL
    FANOUT_ENGINES=testcontainers  this module: postgres / apache/kafka / cassandra images

Either way the result is the same env file, $FANOUT_ENGINES_DIR/engines.env (default
/tmp/fanout-engines/engines.env), with the URLs in fanout's settings vocabulary:

    FANOUT_EVENT_STORE=postgresql://postgres:fanout@127.0.0.1:15432/fanout
    FANOUT_LOG=kafka://127.0.0.1:19092
    FANOUT_VIEWS=cassandra://127.0.0.1:19042/fanout

The containers publish their ports on 127.0.0.1 only, on the same host ports as the local scripts
(FANOUT_ENGINES_POSTGRES_PORT, FANOUT_ENGINES_KAFKA_PORT, FANOUT_ENGINES_CASSANDRA_PORT), so the
Kafka broker can advertise a fixed 127.0.0.1:PORT. Images (override with the settings in
brackets): postgres:15 [FANOUT_ENGINES_POSTGRES_IMAGE], apache/kafka:4.4.0
[FANOUT_ENGINES_KAFKA_IMAGE], cassandra:5.0.9 [FANOUT_ENGINES_CASSANDRA_IMAGE]. Tags matching the
local versions were chosen; whether each tag is published was not checked from here.

Use from Python (fixtures):

    with running_engines() as urls:      # FANOUT_ENGINES picks local or testcontainers
        ...urls["FANOUT_LOG"]...
    with engines_in_use() as urls:       # those of the env file when they answer, else as above
        ...                              # (the test fixtures, tests/engines.py; bench/headline.py)

or from a shell (containers are then kept until `down`; Ryuk, testcontainers' reaper, is turned
off for them so they outlive this process, and their ids are kept in the engines dir):

    python infra/testcontainers/engines.py up
    python infra/testcontainers/engines.py down
    python infra/testcontainers/engines.py run -- COMMAND   # `make test`: one set of engines for
                                                            # all its pytest processes

Fail-loudly policy: an engine that cannot start raises EngineStartError (the CLI exits 1) with
the cause and the container's log tail; nothing is ever skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOCAL_UP = HERE.parent / "engines" / "up.sh"
LOCAL_DOWN = HERE.parent / "engines" / "down.sh"
KEYS = ("FANOUT_EVENT_STORE", "FANOUT_LOG", "FANOUT_VIEWS")
PG_PASSWORD = "fanout"  # the image refuses an empty password; throwaway, loopback only
START_TIMEOUT = int(os.environ.get("FANOUT_ENGINES_START_TIMEOUT", "180"))


class EngineStartError(RuntimeError):
    pass


def engines_dir() -> Path:
    return Path(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines"))


def env_file() -> Path:
    return engines_dir() / "engines.env"


def _port(name: str, default: int) -> int:
    return int(os.environ.get(f"FANOUT_ENGINES_{name}_PORT", str(default)))


def write_env_file(urls: dict[str, str], how: str) -> Path:
    path = env_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    lines = [f"# written by {how} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
             f"# use: set -a; . {path}; set +a"]
    lines += [f"{k}={urls[k]}" for k in KEYS]
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def read_env_file(path: Path | None = None) -> dict[str, str]:
    path = path or env_file()
    urls: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            if k in KEYS:
                urls[k] = v
    missing = [k for k in KEYS if k not in urls]
    if missing:
        raise EngineStartError(f"{path} lacks {', '.join(missing)}")
    return urls


# ------------------------------------------------------------------------------ containers
def _require_docker() -> None:
    try:
        import docker  # installed with testcontainers

        docker.from_env().ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no usable Docker engine"
        raise EngineStartError(
            f"FANOUT_ENGINES=testcontainers needs a running Docker engine, and none answered ({exc}); "
            "use FANOUT_ENGINES=local (infra/engines/up.sh) on machines without Docker"
        ) from None


def _loopback(container: Any, container_port: int, host_port: int) -> None:
    # docker-py accepts (ip, port) as a binding: publish on 127.0.0.1 only
    container.ports[f"{container_port}/tcp"] = ("127.0.0.1", host_port)


def _log_tail(container: Any, lines: int = 40) -> str:
    try:
        out, err = container.get_logs()
        text = (out or b"").decode(errors="replace") + (err or b"").decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
    except Exception as exc:  # noqa: BLE001
        return f"(no logs: {exc})"


def start_containers() -> tuple[dict[str, str], list[Any]]:
    """Start the three containers; returns the URLs and the started containers (stop them)."""
    _require_docker()
    from testcontainers.community.cassandra import CassandraContainer
    from testcontainers.community.postgres import PostgresContainer
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    pg_port, kafka_port, cql_port = _port("POSTGRES", 15432), _port("KAFKA", 19092), _port("CASSANDRA", 19042)

    pg = PostgresContainer(os.environ.get("FANOUT_ENGINES_POSTGRES_IMAGE", "postgres:15"),
                           username="postgres", password=PG_PASSWORD, dbname="fanout", driver=None)
    _loopback(pg, 5432, pg_port)

    kafka = DockerContainer(os.environ.get("FANOUT_ENGINES_KAFKA_IMAGE", "apache/kafka:4.4.0"))
    # testcontainers' KafkaContainer targets confluentinc/cp-kafka (its KRaft check wants tag >= 7.0.0),
    # so the Apache image is configured by hand: one combined broker+controller, as infra/engines/kafka-up.sh
    kafka.with_envs(
        KAFKA_NODE_ID="1",
        KAFKA_PROCESS_ROLES="broker,controller",
        KAFKA_LISTENERS="PLAINTEXT://:9092,CONTROLLER://:9093",
        KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://127.0.0.1:{kafka_port}",
        KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
        KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        KAFKA_CONTROLLER_QUORUM_VOTERS="1@localhost:9093",
        KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
        KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS="5",
        KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
        KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
        KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS="5",
        KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR="1",
        KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR="1",
        KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
        KAFKA_HEAP_OPTS="-Xmx512m",
    )
    kafka.waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(START_TIMEOUT))
    _loopback(kafka, 9092, kafka_port)

    cas = CassandraContainer(os.environ.get("FANOUT_ENGINES_CASSANDRA_IMAGE", "cassandra:5.0.9"))
    cas.with_env("MAX_HEAP_SIZE", "512M")
    _loopback(cas, 9042, cql_port)

    started: list[Any] = []
    for name, c in (("postgres", pg), ("kafka", kafka), ("cassandra", cas)):
        t0 = time.perf_counter()
        try:
            c.start()
        except Exception as exc:  # noqa: BLE001 - report, stop what started, raise
            tail = _log_tail(c)
            stop_containers(started + [c])
            raise EngineStartError(f"{name} container did not start: {exc}\n--- log tail ---\n{tail}") from exc
        started.append(c)
        print(f"testcontainers: {name} ready in {time.perf_counter() - t0:.1f}s ({c.image})", file=sys.stderr)
    urls = {
        "FANOUT_EVENT_STORE": f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:{pg_port}/fanout",
        "FANOUT_LOG": f"kafka://127.0.0.1:{kafka_port}",
        "FANOUT_VIEWS": f"cassandra://127.0.0.1:{cql_port}/fanout",
    }
    return urls, started


def stop_containers(containers: list[Any]) -> None:
    for c in reversed(containers):
        try:
            c.stop()
        except Exception as exc:  # noqa: BLE001
            print(f"testcontainers: could not stop {getattr(c, 'image', c)}: {exc}", file=sys.stderr)


# ------------------------------------------------------------------------------ running ones
def answering(urls: dict[str, str]) -> bool:
    """Whether each engine's first host:port of `urls` accepts a TCP connection within a second."""
    import socket
    from urllib.parse import urlsplit

    for key in KEYS:
        u = urlsplit(urls[key].split(",")[0])
        try:
            with socket.create_connection(((u.hostname or "127.0.0.1").split(",")[0], u.port or 0), timeout=1.0):
                pass
        except OSError:
            return False
    return True


@contextmanager
def engines_in_use() -> Iterator[dict[str, str]]:
    """The engines of the env file when they all answer (left running afterwards); otherwise
    started by `running_engines()` and stopped at the end. Raises EngineStartError."""
    try:
        urls = read_env_file()
    except (OSError, EngineStartError):
        urls = {}
    if urls and answering(urls):
        yield urls
        return
    with running_engines() as started:
        yield started


# ------------------------------------------------------------------------------ the one setting
def selected() -> str:
    how = os.environ.get("FANOUT_ENGINES", "local")
    if how not in ("local", "testcontainers"):
        raise EngineStartError(f"FANOUT_ENGINES={how!r}: expected 'local' or 'testcontainers'")
    return how


@contextmanager
def running_engines() -> Iterator[dict[str, str]]:
    """Start the engines FANOUT_ENGINES selects, yield their URLs, stop them afterwards.

    local: runs infra/engines/up.sh (engines already up are reused) and down.sh at the end.
    testcontainers: starts the containers in this process (Ryuk reaps them if the process dies).
    Raises EngineStartError when an engine cannot start: callers must not turn it into a skip.
    """
    if selected() == "local":
        r = subprocess.run([str(LOCAL_UP)], capture_output=True, text=True)
        if r.returncode != 0:
            raise EngineStartError(f"infra/engines/up.sh failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
        try:
            yield read_env_file()
        finally:
            subprocess.run([str(LOCAL_DOWN)], check=False)
        return
    urls, started = start_containers()
    write_env_file(urls, "infra/testcontainers/engines.py")
    try:
        yield urls
    finally:
        stop_containers(started)
        env_file().unlink(missing_ok=True)


# ------------------------------------------------------------------------------ CLI
def _ids_file() -> Path:
    return engines_dir() / "testcontainers.json"


def cli_up() -> int:
    # keep the containers after this process exits: no reaper; `down` removes them by id
    os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    from testcontainers.core.config import testcontainers_config

    testcontainers_config.ryuk_disabled = True
    if _ids_file().exists():
        print(f"testcontainers: {_ids_file()} exists: run `down` first", file=sys.stderr)
        return 1
    urls, started = start_containers()
    engines_dir().mkdir(parents=True, exist_ok=True)
    _ids_file().write_text(json.dumps([c.get_wrapped_container().id for c in started]))
    path = write_env_file(urls, "infra/testcontainers/engines.py up")
    print(path.read_text(), end="")
    return 0


def cli_down() -> int:
    if not _ids_file().exists():
        print("testcontainers: nothing to stop", file=sys.stderr)
        return 0
    import docker

    client = docker.from_env()
    rc = 0
    for cid in json.loads(_ids_file().read_text()):
        try:
            client.containers.get(cid).remove(force=True, v=True)
            print(f"testcontainers: removed {cid[:12]}", file=sys.stderr)
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # noqa: BLE001
            print(f"testcontainers: could not remove {cid[:12]}: {exc}", file=sys.stderr)
            rc = 1
    _ids_file().unlink()
    env_file().unlink(missing_ok=True)
    return rc


def cli_run(command: list[str]) -> int:
    """Run `command` with the engines up: those of the env file when they answer (left
    running), else started here and stopped when it ends. Several pytest processes (`make
    test`'s workers) then share one set of engines that none of them owns."""
    with engines_in_use():
        return subprocess.call(command)


USAGE = (
    "usage: engines.py up|down        containers (FANOUT_ENGINES=local: infra/engines/up.sh)\n"
    "       engines.py run -- COMMAND  COMMAND with the engines up (started and stopped around it if down)"
)


def main(argv: list[str]) -> int:
    if argv[:2] == ["run", "--"] and len(argv) > 2:
        try:
            return cli_run(argv[2:])
        except EngineStartError as exc:
            print(f"engines: ERROR: the engines did not start: {exc}", file=sys.stderr)
            return 1
    if len(argv) != 1 or argv[0] not in ("up", "down"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return cli_up() if argv[0] == "up" else cli_down()
    except EngineStartError as exc:
        print(f"testcontainers: ERROR: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
