"""A distributed deployment on the shared engines, for the demo (`fanout demo --distributed`),
the benches (bench/distributed_common.py) and the tests (tests/distributed/cluster.py):

* a **namespace**: a PostgreSQL database, a Kafka topic (and its .pushes topic) and a
  Cassandra keyspace of one name, so that runs side by side on the same engines never meet;
  the three URLs (FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS) name them. `create()` makes
  the database (the relay creates the topics, the first replica the keyspace), `drop()`
  removes them all;
* a **fleet**: `fanout relay`, `fanout worker` and `fanout serve` as subprocesses
  (`python -m cli.<kind>`) with the namespace's URLs in their environment (`process_env`),
  each one's output in `<logs>/<name>.log`; stopped with SIGTERM, killed if they hang.

Only domain/, projections/ and fanout/ of the project are imported here (the URL parsers of
fanout/urls.py); the engines are reached with their own client libraries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]  # the project: the subprocesses' PYTHONPATH
ENGINE_KEYS = ("FANOUT_EVENT_STORE", "FANOUT_LOG", "FANOUT_VIEWS")


class NamespaceError(RuntimeError):
    """A namespace could not be created; the message names the engine and what went wrong."""


def with_url(url: str, *, path: str | None = None, query: Mapping[str, str] | None = None) -> str:
    """`url` with its path replaced by /`path` (when given) and `query` added to its query."""
    u = urlsplit(url)
    q = dict(parse_qsl(u.query))
    q.update(query or {})
    return urlunsplit((u.scheme, u.netloc, u.path if path is None else "/" + path, urlencode(q), ""))


class Namespace:
    """A database, topic and keyspace named `name` (default `<prefix>_<10 hex digits>`) on the
    engines the three URLs of `engines` reach; `urls` names them, the topic with
    `partitions`. `keyspace_timeout`: seconds `drop()` gives Cassandra to drop the keyspace
    (a large one takes minutes)."""

    def __init__(
        self,
        engines: Mapping[str, str],
        partitions: int,
        *,
        name: str | None = None,
        prefix: str = "fanout",
        keyspace_timeout: float = 120.0,
    ) -> None:
        self.name = name or f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.engines = {k: engines[k] for k in ENGINE_KEYS}
        self.keyspace_timeout = keyspace_timeout
        self.urls = {
            "FANOUT_EVENT_STORE": with_url(self.engines["FANOUT_EVENT_STORE"], path=self.name),
            "FANOUT_LOG": with_url(
                self.engines["FANOUT_LOG"], query={"topic": self.name, "partitions": str(partitions)}
            ),
            "FANOUT_VIEWS": with_url(self.engines["FANOUT_VIEWS"], path=self.name),
        }

    @classmethod
    def of(cls, urls: Mapping[str, str], *, keyspace_timeout: float = 120.0) -> Namespace:
        """The namespace that `urls` (the `urls` of one made here) name."""
        from fanout.urls import kafka_settings

        name = urlsplit(urls["FANOUT_EVENT_STORE"]).path.strip("/")
        partitions = kafka_settings(urls["FANOUT_LOG"]).partitions
        ns = cls(urls, partitions, name=name, keyspace_timeout=keyspace_timeout)
        ns.urls = {k: urls[k] for k in ENGINE_KEYS}
        return ns

    @property
    def admin(self) -> str:
        """The URL of the PostgreSQL server's `postgres` database (to create and drop ours)."""
        return with_url(self.engines["FANOUT_EVENT_STORE"], path="postgres")

    def create(self) -> None:
        """The database; NamespaceError when PostgreSQL refuses or does not answer."""
        import psycopg

        try:
            with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'CREATE DATABASE "{self.name}"')
        except psycopg.Error as exc:
            raise NamespaceError(f"PostgreSQL at {self.engines['FANOUT_EVENT_STORE']}: {exc}") from None

    def drop(self, *, topics: bool = True, keyspace: bool = True) -> list[str]:
        """Drop the database, the topic and its .pushes topic (unless not `topics`) and the
        keyspace (unless not `keyspace`), each whatever became of the others; returns what
        could not be dropped."""
        failed = []
        try:
            import psycopg

            with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except Exception as exc:
            failed.append(f"database {self.name}: {exc}")
        if topics:
            try:
                self._drop_topics()
            except Exception as exc:
                failed.append(f"topic {self.name}: {exc}")
        if keyspace:
            try:
                self._drop_keyspace()
            except Exception as exc:
                failed.append(f"keyspace {self.name}: {exc}")
        return failed

    def _drop_topics(self) -> None:
        from confluent_kafka.admin import AdminClient

        from fanout.urls import kafka_settings

        admin = AdminClient({"bootstrap.servers": kafka_settings(self.urls["FANOUT_LOG"]).brokers})
        for f in admin.delete_topics([self.name, f"{self.name}.pushes"], operation_timeout=30).values():
            try:
                f.result(timeout=30)
            except Exception as exc:  # a topic never created: nothing to drop
                if "UNKNOWN_TOPIC" not in str(exc):
                    raise

    def _drop_keyspace(self) -> None:
        from cassandra.cluster import Cluster

        from fanout.urls import cassandra_settings

        c = cassandra_settings(self.urls["FANOUT_VIEWS"])
        cluster = Cluster(list(c.hosts), port=c.port, protocol_version=5)
        try:
            cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {c.keyspace}", timeout=self.keyspace_timeout)
        finally:
            cluster.shutdown()


def process_env(
    urls: Mapping[str, str], settings: Mapping[str, str] | None = None, *, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a process of the fleet: `environ` (this process's by default) with
    `urls`, and PYTHONPATH starting at the project, output unbuffered.

    The parameters (FANOUT_<PARAM>) are those of the in-process replica, so that every
    process of the deployment agrees on them: with `settings`, exactly `settings` (this
    process's FANOUT_ variables are left out, but for the engine scripts' FANOUT_ENGINES*);
    without, this process's own (only its engine URLs and FANOUT_DATA_DIR are left out)."""
    env = dict(os.environ if environ is None else environ)
    if settings is None:
        env = {k: v for k, v in env.items() if k not in (*ENGINE_KEYS, "FANOUT_DATA_DIR")}
    else:
        env = {k: v for k, v in env.items() if not k.startswith("FANOUT_") or k.startswith("FANOUT_ENGINES")}
    env.update(urls)
    env.update(settings or {})
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Fleet:
    """Subprocesses of one deployment by name (`relay`, `worker-2`, `serve`...): each is
    `python -m <module> <args>` with `env` (plus its own variables), run in `cwd`, its
    stdout and stderr appended to `<logs>/<name>.log` (a process started again under the
    same name continues its log)."""

    def __init__(self, env: Mapping[str, str], logs: Path, *, cwd: Path | None = None) -> None:
        self.env = dict(env)
        self.logs = logs
        self.cwd = cwd
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, module: str, *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """`env`: more variables for this process alone (e.g. FANOUT_FAILPOINTS)."""
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=self.cwd,
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def exited(self) -> dict[str, int]:
        """name -> exit code, of the processes that are no longer running."""
        return {name: code for name, p in self.procs.items() if (code := p.poll()) is not None}

    def tail(self, name: str, chars: int = 1500) -> str:
        """The end of a process's log ("" before it wrote one)."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Send `sig` to one process (unless it has exited) and wait for it; it leaves the fleet."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(timeout)

    def pause(self, name: str) -> None:
        """SIGSTOP: alive (its connections kept for a while) but doing nothing."""
        self.procs[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGCONT)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Send `sig` to every running process, wait `timeout` s for each, SIGKILL one that
        is still running then; the fleet is empty afterwards."""
        procs = list(self.procs.values())
        self.procs.clear()
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)
        for p in procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
