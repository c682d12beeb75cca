"""A distributed deployment for a test: its own PostgreSQL database, Kafka topic and
Cassandra keyspace on the shared engines (tools/deploy.py `Namespace`), `fanout relay` and
`fanout worker` as real subprocesses (killable with SIGKILL; tools/deploy.py `Fleet`), and API
replicas built in-process by the composition root (`fanout.bootstrap.bootstrap_distributed`)
from the same URLs."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fanout.bootstrap import bootstrap_distributed, open_cassandra_views
from fanout.config import load_settings
from fanout.distributed import DistributedRuntime
from fanout.urls import cassandra_settings
from tools.deploy import Fleet, Namespace, process_env

if TYPE_CHECKING:
    from tests.engines import Keyspaces

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    urls: dict[str, str]  # FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS
    logs: Path
    settings_env: dict[str, str] = field(default_factory=dict)  # FANOUT_<PARAM> for every process
    runtimes: list[DistributedRuntime] = field(default_factory=list)
    fleet: Fleet = field(init=False)

    def __post_init__(self) -> None:
        self.fleet = Fleet(self.env(), self.logs, cwd=ROOT)

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        return self.fleet.procs

    def env(self) -> dict[str, str]:
        """The subprocesses' environment: the URLs and `settings_env`, no other FANOUT_ parameter."""
        return process_env(self.urls, self.settings_env)

    def start(self, name: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """`relay`, or `worker` / `worker-2` ...: a subprocess of `python -m cli.<kind>`
        (`env`: more variables for this process alone, e.g. FANOUT_FAILPOINTS)."""
        kind = name.split("-")[0]
        args = ["--session-timeout", "6"] if kind == "worker" else []
        self.fleet.env = self.env()  # as it is now (a test may change settings_env between starts)
        return self.fleet.start(name, f"cli.{kind}", *args, env=env)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.fleet.kill(name, sig)

    def pause(self, name: str) -> None:
        """SIGSTOP a process: alive (its connections and group membership kept for a while)
        but doing nothing, so "it is behind" is a fact of the test, not a race."""
        self.fleet.pause(name)

    def resume(self, name: str) -> None:
        self.fleet.resume(name)

    def log_of(self, name: str) -> str:
        return self.fleet.tail(name, 4000)

    def replica(self, **settings: str) -> DistributedRuntime:
        env: Mapping[str, str] = {**self.urls, **self.settings_env, **settings}
        rt = bootstrap_distributed(load_settings(env)).start()
        self.runtimes.append(rt)
        return rt

    def wait_workers(self, count: int = 1, timeout: float = 60.0) -> None:
        """Until `count` workers beat (ADR-0019) and every partition of the topic is held."""
        rt = self.runtimes[0] if self.runtimes else self.replica()
        deadline = time.monotonic() + timeout
        every = set(range(rt.partitions))
        while rt.links.workers() < count or not every <= rt.links.worker_partitions():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            assert not dead, f"{dead} exited: {self.log_of(dead[0])}"
            assert time.monotonic() < deadline, f"{count} workers not up in {timeout} s: {self.log_of('worker')}"
            time.sleep(0.2)

    def settle(self, rt: DistributedRuntime | None = None, timeout: float = 60.0) -> None:
        """Until the views hold everything written so far (relay and workers caught up)."""
        rt = rt or self.runtimes[0]
        if not rt.wait_until(rt.log_position(), timeout):
            raise AssertionError(
                f"views at {rt.position()}, log at {rt.log_position()} after {timeout} s\n" + self.state(rt)
            )

    def state(self, rt: DistributedRuntime) -> str:
        """What a failed wait shows: each partition's tracked positions, the partitions each
        worker says it holds, and the end of every process's log."""
        try:
            tracked = sorted(rt.views.positions().items())
        except Exception as exc:  # the views away: say so and show the logs anyway
            tracked = [(("unreadable", -1), repr(exc))]  # type: ignore[list-item]
        held = rt.links.worker_partitions()
        logs = "\n".join(f"--- {n}:\n{self.log_of(n)}" for n in self.procs)
        return f"tracked (projection, partition) -> position: {tracked}\nheld: {sorted(held)}\n{logs}"

    def close(self, sig: int = signal.SIGTERM) -> None:
        """Close the replicas, then end the subprocesses with `sig` (SIGKILL when the
        namespace is thrown away anyway)."""
        for rt in self.runtimes:
            rt.close()
        self.fleet.stop(sig)


def cluster_for(urls: dict[str, str], logs: Path, **settings: Any) -> Cluster:
    logs.mkdir(parents=True, exist_ok=True)
    return Cluster(urls, logs, {k: str(v) for k, v in settings.items()})


@contextlib.contextmanager
def running_cluster(postgres: str, kafka: str, cassandra: str, logs: Path, **settings: Any) -> Iterator[Cluster]:
    """A deployment on the fresh namespace's URLs: a replica first (it creates the event
    store's tables and the keyspace before the others start), the relay, one worker holding
    every partition; closed after. Sends of one sender are not rate-limited (1000/s)."""
    c = cluster_for(
        {"FANOUT_EVENT_STORE": postgres, "FANOUT_LOG": kafka, "FANOUT_VIEWS": cassandra},
        logs,
        **{"FANOUT_PER_SENDER_IN_CONVERSATION_RATE": "1000/s", **settings},
    )
    try:
        c.replica()
        c.start("relay")
        c.start("worker")
        c.wait_workers(1)
        yield c
    finally:
        c.close()


def create_namespace(
    engines: Mapping[str, str], partitions: int = 4, *, schema: bool = False, views: str | None = None
) -> dict[str, str]:
    """FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS naming a new PostgreSQL database, Kafka
    topic and Cassandra keyspace on the shared engines (the topic is created by the relay);
    `views`: an existing keyspace's URL instead of a new one (a pool's, tests/engines.py
    `Keyspaces`); `schema`: the keyspace's tables created now (what the first replica would do)."""
    from tests.engines import unique

    ns = Namespace(engines, partitions, name=unique("t"))
    ns.create()
    urls = {**ns.urls, **({"FANOUT_VIEWS": views} if views is not None else {})}
    if schema:
        try:
            open_cassandra_views(cassandra_settings(urls["FANOUT_VIEWS"]), partitions=partitions).close()
        except BaseException:
            drop_namespace(urls, keyspace=views is None)
            raise
    return urls


def drop_namespace(urls: Mapping[str, str], *, keyspace: bool = True) -> None:
    """Drop what `create_namespace` created (the topics stay: Kafka deletes nothing here; the
    keyspace too unless not `keyspace`); RuntimeError naming what could not be dropped."""
    failed = Namespace.of(urls, keyspace_timeout=60).drop(topics=False, keyspace=keyspace)
    if failed:
        raise RuntimeError(f"could not drop {'; '.join(failed)}")


@contextlib.contextmanager
def fresh_namespace(engines: Mapping[str, str], partitions: int = 4) -> Iterator[dict[str, str]]:
    """A new namespace for fixtures broader than one test (tests/engines.py `fresh_*`);
    dropped afterwards."""
    urls = create_namespace(engines, partitions)
    try:
        yield urls
    finally:
        drop_namespace(urls)


class NamespacePool:
    """Namespaces with their Cassandra schema prepared ahead, and dropped, in one background
    thread: creating a keyspace's 14 tables takes 2-15 s on a loaded 2-core machine, so a
    suite of many deployments (the e2e suite, one per module) prepares the next one while
    the current one runs its tests. Cassandra applies schema changes one at a time, even a
    CREATE ... IF NOT EXISTS that changes nothing: background schema work while a replica
    opens its views (which runs those statements) would stall it for as long, so the work is
    queued by `prefetch()`, which a caller makes once its deployment is up. `expected` bounds
    it: no namespace is prepared beyond the number the suite will take."""

    def __init__(self, engines: Mapping[str, str], expected: int, keyspaces: Keyspaces, partitions: int = 4) -> None:
        """`keyspaces`: the session's pool of emptied keyspaces (tests/engines.py), which the
        deployments take and give back instead of creating and dropping their own."""
        self.engines = dict(engines)
        self.partitions = partitions
        self.remaining = expected
        self.keyspaces = keyspaces
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="namespaces")
        self._next: Future[dict[str, str]] | None = None
        self._returned: list[dict[str, str]] = []
        self._dropping: list[Future[None]] = []

    def _create(self) -> dict[str, str]:
        return create_namespace(self.engines, self.partitions, schema=True, views=self.keyspaces.take())

    def _drop(self, urls: Mapping[str, str]) -> None:
        try:
            drop_namespace(urls, keyspace=False)
        finally:
            self.keyspaces.give_back(urls["FANOUT_VIEWS"])

    def _prepare(self) -> Future[dict[str, str]]:
        return self._worker.submit(self._create)

    def take(self) -> dict[str, str]:
        """A prepared namespace (prepared now if none is)."""
        current = self._next if self._next is not None else self._prepare()
        self._next = None
        self.remaining -= 1
        return current.result()

    def give_back(self, urls: Mapping[str, str]) -> None:
        """Drop it at the next `prefetch()` (or `close()`)."""
        self._returned.append(dict(urls))

    def prefetch(self) -> None:
        """Now is a good time for schema work: drop what was given back, prepare the next."""
        self._drop_returned()
        if self.remaining > 0 and self._next is None:
            self._next = self._prepare()

    def _drop_returned(self) -> None:
        while self._returned:
            self._dropping.append(self._worker.submit(self._drop, self._returned.pop()))

    def close(self) -> None:
        if self._next is not None:
            with contextlib.suppress(Exception):
                self.give_back(self._next.result())
            self._next = None
        self._drop_returned()
        self._worker.shutdown(wait=True)
        for f in self._dropping:
            f.result()  # a namespace that could not be dropped fails the session loudly
