"""`fanout demo --distributed`: the story of cli/demo.py on the distributed runtime's real
engines: the demo's own database, topic and keyspace on the shared engines (a namespace,
tools/deploy.py), `fanout relay` and `fanout worker` started as subprocesses (the fleet),
an API replica in this process; each step waits for the workers to project (`settle`)
instead of projecting in this thread. Everything is dropped at the end unless --keep."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from cli.demo import DemoError, Out, Story
from domain.params import Parameters
from fanout.bootstrap import bootstrap_distributed
from fanout.clock import FakeClock
from fanout.config import Settings
from fanout.distributed import DistributedRuntime
from tools.deploy import ENGINE_KEYS, Fleet, Namespace, NamespaceError, process_env

# Default --members with --distributed: the same 100k as the embedded demo. Measured on the
# loopback engines (2 shared cores): about 66 s for the whole story at 100k members, ~4 s per
# 100k-entry message through relay, worker and Cassandra; 20k members ~18 s, 2k ~15 s (mostly
# the worker joining its group).
DISTRIBUTED_MEMBERS = 100_000
SETTLE_TIMEOUT = 300.0  # seconds a step waits for the views before the demo gives up
START_TIMEOUT = 120.0  # seconds for the relay and the worker to come up


def engine_urls(env: dict[str, str] | None = None) -> dict[str, str]:
    """The three engine URLs: from the environment when it names the distributed engines,
    else from $FANOUT_ENGINES_DIR/engines.env (written by `make engines-up`)."""
    env = dict(os.environ if env is None else env)
    if all(k in env for k in ENGINE_KEYS) and env["FANOUT_EVENT_STORE"].startswith(("postgresql://", "postgres://")):
        return {k: env[k] for k in ENGINE_KEYS}
    path = Path(env.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines")) / "engines.env"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        raise DemoError(
            f"no engines: set {', '.join(ENGINE_KEYS)} (postgresql://, kafka://, cassandra://) or start them with "
            f"`make engines-up` (writes {path})"
        ) from None
    urls = {
        k: v for k, v in (ln.split("=", 1) for ln in lines if "=" in ln and not ln.startswith("#")) if k in ENGINE_KEYS
    }
    missing = [k for k in ENGINE_KEYS if k not in urls]
    if missing:
        raise DemoError(f"{path} does not name {', '.join(missing)}")
    return urls


class _Processes(Fleet):
    """`fanout relay` and `fanout worker` as subprocesses of the demo."""

    def check(self) -> None:
        for kind, code in self.exited().items():
            raise DemoError(f"`fanout {kind}` exited with {code}: {self.tail(kind)}")


def run_distributed_demo(
    members: int = DISTRIBUTED_MEMBERS,
    *,
    params: Parameters | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    keep: bool = False,
    partitions: int = 4,
    urls: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The demo's story on PostgreSQL, Kafka (relay), Faust (worker) and Cassandra."""
    params = params or Parameters()
    o = Out(out if out is not None else sys.stdout, time.monotonic())
    progress = err if err is not None else sys.stderr
    if members < 200:
        raise DemoError("--members must be at least 200 (the story needs silent and active members)")
    if members > params.max_group_members:
        raise DemoError(f"--members {members} exceeds max_group_members={params.max_group_members}")
    if partitions < 1:
        raise DemoError("--partitions must be at least 1")
    # the demo's own database, topic and keyspace on the shared engines
    ns = Namespace(urls or engine_urls(), partitions, prefix="fanout_demo")
    logs = Path(tempfile.mkdtemp(prefix="fanout-demo-"))
    # the subprocesses get this process's FANOUT_ parameters and the demo's URLs
    procs = _Processes(process_env(ns.urls), logs)

    def note(text: str) -> None:
        print(f"demo: {text}", file=progress, flush=True)

    try:
        ns.create()
    except NamespaceError as exc:
        raise DemoError(str(exc)) from None
    rt: DistributedRuntime | None = None
    loop = asyncio.new_event_loop()
    try:
        o.line(f"distributed runtime: database, topic ({partitions} partitions) and keyspace {ns.name}")
        for k in ENGINE_KEYS:
            o.line(f"  {k}={ns.urls[k]}")
        clock = FakeClock(float(int(time.time())))
        settings = Settings(
            params, logs, ns.urls["FANOUT_EVENT_STORE"], ns.urls["FANOUT_LOG"], ns.urls["FANOUT_VIEWS"], None
        )
        note("creating the event store tables and the keyspace (an API replica)")
        rt = bootstrap_distributed(settings, clock=clock).start()
        procs.start("relay", "cli.relay")
        procs.start("worker", "cli.worker")
        note(f"waiting for `fanout relay` and `fanout worker` (logs in {logs})")
        deadline = time.monotonic() + START_TIMEOUT
        while rt.links.workers() < 1:
            procs.check()
            if time.monotonic() > deadline:
                raise DemoError(
                    f"the worker did not join its consumer group in {START_TIMEOUT:.0f} s: {procs.tail('worker')}"
                )
            time.sleep(0.5)
        runtime = rt

        def settle() -> None:
            top = runtime.log_position()
            started = time.monotonic()
            shown = 0.0
            while not runtime.wait_until(top, 1.0):
                procs.check()
                waited = time.monotonic() - started
                if waited > SETTLE_TIMEOUT:
                    raise DemoError(
                        f"the views stayed at position {runtime.position()} of {top} for {SETTLE_TIMEOUT:.0f} s; "
                        f"worker log: {procs.tail('worker')}"
                    )
                if waited - shown >= 2.0:
                    shown = waited
                    note(f"waiting for the views: position {runtime.position()} of {top} ({waited:.0f} s)")

        note("relay and worker up; the story starts")
        summary = Story(rt, clock, members, o, loop, settle).run()
        summary["namespace"] = ns.name
        summary["urls"] = dict(ns.urls)
    finally:
        if rt is not None:
            rt.close()
        loop.close()
        procs.stop()
        if keep:
            note(f"kept database, topic and keyspace {ns.name}; logs in {logs}")
        else:
            for failure in ns.drop():
                note(f"could not drop {failure}")
            shutil.rmtree(logs, ignore_errors=True)
    summary["seconds"] = round(time.monotonic() - o.started, 2)
    o.line(f"\ndemo finished in {summary['seconds']:.1f}s on the distributed runtime ({ns.name})")
    if keep:
        o.line("  inspect it with: " + " ".join(f"{k}='{ns.urls[k]}'" for k in ENGINE_KEYS) + " fanout verify")
    return summary


def main_distributed_demo(
    members: int | None, params: Parameters, *, quiet: bool = False, keep: bool = False, partitions: int | None = None
) -> int:
    out: TextIO = open(os.devnull, "w") if quiet else sys.stdout  # noqa: SIM115
    try:
        summary = run_distributed_demo(
            members or DISTRIBUTED_MEMBERS, params=params, out=out, err=out if quiet else sys.stderr, keep=keep,
            partitions=partitions or 4,
        )  # fmt: skip
    finally:
        if quiet:
            out.close()
    return 0 if summary["converged"] else 1
