"""Sends over HTTP, as a service publishes them (ADR-0024): `fanout serve`
as a subprocess, --groups groups of --members members created over HTTP, then --messages sends
(`POST /v1/conversations/{cid}/messages`, or with --batch N `POST /v1/messages/batch` of N)
from --clients concurrent keep-alive aiohttp clients, round-robin over the groups.

    .venv/bin/python bench/http_sends.py                          # embedded, 300 groups of 20, 3,000 sends, 16 clients
    .venv/bin/python bench/http_sends.py --batch 50               # the same sends, 50 per request
    .venv/bin/python bench/http_sends.py --in-process             # the reference: no HTTP, projector running
    .venv/bin/python bench/http_sends.py --runtime distributed    # the running engines, relay + 1 worker
    .venv/bin/python bench/http_sends.py --runtime both           # one after the other, same arguments
    .venv/bin/python bench/http_sends.py --source /tmp/before     # the server from another tree (before/after)
    .venv/bin/python bench/http_sends.py --profile /tmp/prof      # embedded server under cProfile (see below)
    .venv/bin/python bench/http_sends.py --groups 20 --messages 300   # smoke

Embedded (the default): `fanout serve` over a temporary data dir (projector in the same
process, as in production). Distributed: a database, topic and keyspace of the bench's own on
the engines of $FANOUT_ENGINES_DIR/engines.env (bench/distributed_common.py, dropped at the
end), `fanout relay`, --workers `fanout worker` and one `fanout serve`. The admission gates
and the backpressure limits are opened wide (distributed_common.OPEN_GATES): this measures
the machinery, not the limits. The clock is real. The server runs `cli.main serve` in a small
harness of this file (`_serve`), which notes the CPU time of each of its threads on a signal.

Printed: sends accepted/s (first send to last answer), the latency of a request as the client
sees it (p50, p99), end to end (first send until the views hold the last one, waited for with
a fresh read `GET /v1/me/sessions?min_position=` of the highest position answered: every
partition), the CPU used by each process over the sends and until the views held all (the
server; the relay, workers and engines on the distributed runtime; this client process, which
shares the same cores), and the server's CPU per accepted send: user and system, context
switches, and per thread (the event loop `MainThread`, the sends' `fanout-commands`, the
executor `fanout-api`, the embedded `fanout-projector`). On a shared machine the rates move
with the other load; the CPU per send moves much less. Prints numbers; asserts nothing.

--profile DIR runs the server under cProfile, timed by each thread's CPU time (so waiting for a
lock or on epoll counts nothing), one profiler per thread (the event loop, the executor's
threads and the sends' lane; not the embedded projector's or the distributed runtime's own
threads, which exist before profiling starts), only while the sends run, and writes DIR/<thread>.prof plus the top functions of each
to the server's log (kept); the profiler slows the server down several times, so its rates
are not the bench's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed_common import (  # noqa: E402
    OPEN_GATES,
    ROOT,
    SECRET,
    TENANT,
    Fleet,
    MemoryWatch,
    Namespace,
    exit_on_sigterm,
    free_port,
    watch_fleet,
)
from durability import distributed as distributed_durability  # noqa: E402
from durability import embedded as embedded_durability  # noqa: E402

# Read by the server's harness (not FANOUT_*: serve refuses unknown FANOUT_ settings).
PROFILE_ENV = "BENCH_HTTP_PROFILE_DIR"
THREADS_ENV = "BENCH_HTTP_THREADS_FILE"
SOURCE_ENV = "BENCH_HTTP_SOURCE"


# -- the server ---------------------------------------------------------------------------


class Server:
    """`fanout serve` (and, distributed, its relay and workers) as subprocesses."""

    def __init__(
        self, runtime: str, workers: int, partitions: int, profile: Path | None, source: Path | None = None
    ) -> None:
        self.runtime = runtime
        self.ns: Namespace | None = None
        urls: dict[str, str] = {}
        if runtime == "distributed":
            self.ns = Namespace(partitions, prefix="bench_http")
            self.ns.create()
            urls = self.ns.urls
        self.fleet = Fleet(urls, OPEN_GATES)
        self.source = source or ROOT  # the tree `fanout serve` runs from
        self.fleet.env["PYTHONPATH"] = str(self.source)
        self.data = Path(tempfile.mkdtemp(prefix="fanout-bench-http-"))
        self.workers = workers
        self.profile = profile
        self.threads_file = self.fleet.logs / "threads.json"
        self.base = ""

    def start(self) -> str:
        if self.ns is not None:  # the relay and workers run from this tree (cwd), whatever --source
            self.fleet.start_pipeline(self.workers)
        port = free_port()
        args = ["serve", "--data-dir", str(self.data), "--port", str(port)]
        self.fleet.env[THREADS_ENV] = str(self.threads_file)
        if self.profile is not None:
            self.fleet.env[PROFILE_ENV] = str(self.profile)
        self.fleet.env[SOURCE_ENV] = str(self.source)
        with open(self.fleet.logs / "serve.log", "wb") as log:  # this file's harness, the server's tree
            cmd = [sys.executable, str(Path(__file__).resolve()), "_serve", *args]
            self.fleet.procs["serve"] = subprocess.Popen(
                cmd, env=self.fleet.env, stdout=log, stderr=log, cwd=self.source
            )
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:  # ready: projectors running, every engine reachable, a worker alive
            try:
                urllib.request.urlopen(self.base + "/readyz", timeout=2).close()
                return self.base
            except OSError:
                if self.fleet.procs["serve"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fanout serve not ready: see {self.fleet.logs}") from None
                time.sleep(0.2)

    def watch(self, watch: MemoryWatch) -> None:
        if self.ns is not None:
            watch_fleet(watch, self.fleet, "this process (the clients)")
        else:
            watch.watch("fanout serve", partial(list, [self.fleet.procs["serve"].pid]))
            watch.watch("this process (the clients)", partial(list, [os.getpid()]))

    def mark(self) -> None:
        """The harness notes each thread's CPU (and starts the profilers, with --profile)."""
        os.kill(self.fleet.procs["serve"].pid, signal.SIGUSR1)

    def threads(self) -> dict[str, float]:
        """The CPU each server thread used since mark() (and the profiles dumped)."""
        self.threads_file.unlink(missing_ok=True)
        os.kill(self.fleet.procs["serve"].pid, signal.SIGUSR1)
        deadline = time.monotonic() + 600  # dumping the profiles takes a while
        while time.monotonic() < deadline:
            try:
                return dict(json.loads(self.threads_file.read_text()))
            except (OSError, ValueError):
                time.sleep(0.1)
        return {}

    def stop(self, keep_logs: bool) -> None:
        self.fleet.stop()
        shutil.rmtree(self.data, ignore_errors=True)
        if keep_logs:
            print(f"logs kept in {self.fleet.logs}", flush=True)
        else:
            shutil.rmtree(self.fleet.logs, ignore_errors=True)
        if self.ns is not None:
            for problem in self.ns.drop():
                print(f"not dropped: {problem}", flush=True)


# -- the clients ----------------------------------------------------------------------------


async def run_bench(args: argparse.Namespace, server: Server, watch: MemoryWatch) -> None:
    import aiohttp
    import psutil

    from fanout.security import mint_token

    service = {"Authorization": f"Bearer {mint_token(SECRET, TENANT, 'service', 'bench')}"}
    user = {"Authorization": f"Bearer {mint_token(SECRET, TENANT, 'user', 'u0')}"}
    base = server.base
    connector = aiohttp.TCPConnector(limit=args.clients, limit_per_host=args.clients)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
            async with http.post(base + path, json=body, headers=service) as r:
                return r.status, await r.json()

        async def views_hold(position: int) -> None:
            """Until a fresh read spanning every partition answers (it waits on the server side)."""
            while True:
                async with http.get(f"{base}/v1/me/sessions?min_position={position}", headers=user) as r:
                    await r.read()
                    if r.status == 200:
                        return
                    if r.status != 503:
                        raise RuntimeError(f"GET /v1/me/sessions answered {r.status}")

        # Set-up: the groups, created concurrently, then projected.
        members = [f"u{i}" for i in range(args.members)]
        t = time.monotonic()
        created = await asyncio.gather(
            *(post("/v1/conversations", {"conversation_id": f"g{g}", "members": members}) for g in range(args.groups))
        )
        bad = [c for c in created if c[0] != 201]
        if bad:
            raise RuntimeError(f"creating the groups: {bad[0]}")
        await views_hold(max(int(c[1]["position"]) for c in created))
        print(
            f"{args.groups} groups of {args.members} created and projected in {time.monotonic() - t:.1f} s", flush=True
        )

        # Warm-up: one send per client (connections opened, the first requests' costs paid).
        warm = await asyncio.gather(
            *(
                post(f"/v1/conversations/g{i % args.groups}/messages", {"sender": "u0", "text": "warm"})
                for i in range(args.clients)
            )
        )
        await views_hold(max(int(w[1]["position"]) for w in warm))

        server.mark()
        await asyncio.sleep(0.2)
        latencies: list[float] = []  # of each request
        refused: dict[str, int] = {}
        accepted = [0]
        last = [0]
        next_i = [0]

        def message(i: int) -> dict[str, Any]:
            body: dict[str, Any] = {"sender": members[i % args.members], "text": f"message {i}"}
            if args.client_msg_id:
                body["client_msg_id"] = f"c{i}"
            return body

        def outcome(status: int, answer: Any) -> None:
            if status == 201:
                last[0] = max(last[0], int(answer["position"]))
                accepted[0] += 1
            else:
                code = answer.get("error", str(status)) if isinstance(answer, dict) else str(status)
                refused[code] = refused.get(code, 0) + 1

        async def client() -> None:
            while next_i[0] < args.messages:
                i = next_i[0]
                take = min(args.batch, args.messages - i)
                next_i[0] += take
                t0 = time.perf_counter()
                if args.batch == 1:
                    status, answer = await post(f"/v1/conversations/g{i % args.groups}/messages", message(i))
                    outcome(status, answer)
                else:
                    items = [{"conversation_id": f"g{j % args.groups}", **message(j)} for j in range(i, i + take)]
                    status, answer = await post("/v1/messages/batch", {"messages": items})
                    if status != 200:
                        outcome(status, answer)
                        continue
                    for result in answer["results"]:
                        outcome(result["status"], result)
                latencies.append(time.perf_counter() - t0)

        serve = psutil.Process(server.fleet.procs["serve"].pid)
        times0, switches0 = serve.cpu_times(), serve.num_ctx_switches()
        cpu0 = watch.cpu()
        start = time.monotonic()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        end = time.monotonic()
        cpu_sent = watch.cpu()
        times1, switches1 = serve.cpu_times(), serve.num_ctx_switches()
        threads = server.threads()
        await views_hold(last[0])
        held = time.monotonic()
        cpu_held = watch.cpu()

    n = accepted[0]
    latencies.sort()
    per = "send" if args.batch == 1 else f"request of {args.batch} sends"
    print(
        f"{server.runtime} runtime over HTTP: {args.groups} groups of {args.members}, {n} sends accepted by "
        f"{args.clients} concurrent keep-alive clients{' (with client_msg_id)' if args.client_msg_id else ''}"
        f"{f', POST /v1/messages/batch of {args.batch}' if args.batch > 1 else ''}; "
        f"refused: {refused or 'none'}"
    )
    if n:
        print(
            f"  sends         {n / (end - start):,.0f} accepted/s (p50 {1000 * statistics.median(latencies):.1f} ms, "
            f"p99 {1000 * latencies[int(0.99 * (len(latencies) - 1))]:.1f} ms per {per}, as the client sees it)"
        )
        print(
            f"  end to end    views hold the last send {held - end:.2f} s after it was accepted: "
            f"{n / (held - start):,.0f} messages/s from the first send to the views holding the last"
        )
    print("  sending:      " + watch.cpu_report(cpu0, cpu_sent, end - start), flush=True)
    print("  until held:   " + watch.cpu_report(cpu0, cpu_held, held - start), flush=True)
    server_cpu = [name for name in cpu_held if name.startswith(("fanout serve", "serve"))]
    for name in server_cpu:
        used = cpu_sent[name] - cpu0[name]
        if n:
            print(
                f"  {name}: {1e6 * used / n:,.0f} us of CPU per accepted send while sending (user "
                f"{1e6 * (times1.user - times0.user) / n:,.0f} us, system {1e6 * (times1.system - times0.system) / n:,.0f} us; "
                f"{(switches1.voluntary - switches0.voluntary) / n:.1f} voluntary and "
                f"{(switches1.involuntary - switches0.involuntary) / n:.1f} involuntary context switches per send)"
            )
    if n and threads:
        per = ", ".join(
            f"{name} {1e6 * sec / n:,.0f} us" for name, sec in sorted(threads.items(), key=lambda x: -x[1]) if sec > 0
        )
        print(f"  fanout serve's threads, CPU per accepted send while sending: {per}")


def bench_one(args: argparse.Namespace, runtime: str) -> None:
    profile = Path(args.profile) if args.profile else None
    server = Server(runtime, args.workers, args.partitions, profile, Path(args.source) if args.source else None)
    watch = MemoryWatch(interval=0.5)
    ok = False
    try:
        t = time.monotonic()
        server.start()
        print(f"{runtime}: fanout serve ready in {time.monotonic() - t:.1f} s", flush=True)
        print(embedded_durability() if server.ns is None else distributed_durability(server.ns.urls), flush=True)
        server.watch(watch)
        watch.start()
        asyncio.run(run_bench(args, server, watch))
        ok = True
    finally:
        watch.stop.set()
        server.stop(keep_logs=not ok or args.profile is not None)


def in_process(args: argparse.Namespace) -> None:
    """The reference: the embedded runtime in this process with its projector thread running
    (as in `fanout serve`), the same sends from one thread through `rt.app.send_message`, no
    HTTP. bench/small_groups.py measures the command side with the projector stopped."""
    from fanout.bootstrap import bootstrap
    from fanout.config import load_settings

    print(embedded_durability(), flush=True)
    data = Path(tempfile.mkdtemp(prefix="fanout-bench-http-inproc-"))
    try:
        with bootstrap(load_settings(OPEN_GATES, data_dir=data)) as rt:
            rt.start()
            members = [f"u{i}" for i in range(args.members)]
            for g in range(args.groups):
                rt.app.create_conversation(TENANT, f"g{g}", "", members)
            rt.wait_until(rt.log_position(), 600)
            cpu0, threads0, start = time.process_time(), thread_cpu(), time.monotonic()
            last = 0
            for i in range(args.messages):
                r = rt.app.send_message(
                    TENANT, f"g{i % args.groups}", sender=members[i % args.members], text=f"message {i}"
                )
                last = max(last, int(r["position"]))
            end, cpu1, threads1 = time.monotonic(), time.process_time(), thread_cpu()
            rt.wait_until(last, 600)
            held = time.monotonic()
        n = args.messages
        print(
            f"embedded runtime in-process (projector running, no HTTP): {args.groups} groups of {args.members}, {n} sends from one thread"
        )
        print(f"  sends         {n / (end - start):,.0f} accepted/s")
        print(
            f"  end to end    views hold the last send {held - end:.2f} s after it was accepted: {n / (held - start):,.0f} messages/s"
        )
        per = ", ".join(
            f"{name} {1e6 * (sec - threads0.get(name, 0.0)) / n:,.0f} us" for name, sec in sorted(threads1.items())
            if sec - threads0.get(name, 0.0) > 0
        )  # fmt: skip
        print(
            f"  this process: {1e6 * (cpu1 - cpu0) / n:,.0f} us of CPU per accepted send while sending; threads: {per}"
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=("embedded", "distributed", "both"), default="embedded")
    ap.add_argument("--in-process", action="store_true", help="the reference instead: the embedded runtime in "
                    "this process, projector running, the same sends from one thread, no HTTP")  # fmt: skip
    ap.add_argument("--groups", type=int, default=300)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=16, help="concurrent keep-alive connections")
    ap.add_argument("--client-msg-id", action="store_true", help="every send carries a client_msg_id")
    ap.add_argument("--batch", type=int, default=1, help="sends per request: >1 posts them to /v1/messages/batch")
    ap.add_argument("--workers", type=int, default=1, help="distributed: `fanout worker` processes")
    ap.add_argument("--partitions", type=int, default=4, help="distributed: partitions of the bench's topic")
    ap.add_argument("--source", metavar="TREE", help="run `fanout serve` from this source tree, "
                    "e.g. a copy of the code before a change, for before/after runs (default: this one)")  # fmt: skip
    ap.add_argument("--profile", metavar="DIR", help="the server under cProfile while the sends run")
    args = ap.parse_args()
    if args.profile and args.runtime == "both":
        ap.error("--profile goes with one runtime")
    exit_on_sigterm()
    if args.in_process:
        in_process(args)
        return 0
    for runtime in ("embedded", "distributed") if args.runtime == "both" else (args.runtime,):
        bench_one(args, runtime)
    return 0


# -- the server's harness (`python -m bench.http_sends _serve serve ...`) ----------------------


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by its Python name (a pool's threads
    summed: `fanout-api_3` counts as `fanout-api`)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        name = thread_group(t.name)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_group(name: str) -> str:
    return name.rstrip("0123456789").rstrip("_-") or name


def harness_serve(argv: list[str]) -> int:
    """`fanout serve` (cli.main) in this process, plus: the first SIGUSR1 notes each thread's
    CPU time (and, with $BENCH_HTTP_PROFILE_DIR, starts a cProfile profiler in every thread),
    the second writes the CPU each thread used in between to $BENCH_HTTP_THREADS_FILE (and
    dumps the profiles there, one .prof per kind of thread, the top functions to the log)."""
    import concurrent.futures.thread as cft
    import cProfile
    import json
    import pstats

    from cli.main import main as cli_main

    profile_dir = Path(os.environ[PROFILE_ENV]) if os.environ.get(PROFILE_ENV) else None
    profiles: dict[str, list[cProfile.Profile]] = {}
    state: dict[str, Any] = {"on": False, "cpu": {}}
    pending: set[int | None] = set()
    lock = threading.Lock()

    def enable_here() -> None:
        p = cProfile.Profile(time.thread_time)  # CPU time of the thread: waits (the lock, epoll) cost nothing
        with lock:
            profiles.setdefault(thread_group(threading.current_thread().name), []).append(p)
        p.enable()

    def hook(*_: Any) -> None:  # first call in a thread started while on: a profiler of its own
        threading.setprofile(None)
        sys.setprofile(None)
        if state["on"]:
            enable_here()

    def dump(out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        for name, ps in profiles.items():
            for p in ps:
                p.disable()
            stats = pstats.Stats(ps[0])
            for p in ps[1:]:
                stats.add(p)
            stats.dump_stats(str(out / f"{name}.prof"))
            print(f"--- profile of thread(s) {name}: {out / (name + '.prof')}", flush=True)
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(40)

    def on_signal(*_: Any) -> None:
        if not state["on"]:
            state["on"] = True
            state["cpu"] = thread_cpu()
            if profile_dir is not None:
                threading.setprofile(hook)
                enable_here()  # the event loop's thread (signal handlers run there)
                # threads already running cannot be given a profiler from outside: the
                # executor's threads enable theirs at their next work item (patched below);
                # the projector's thread is not profiled (it is not on the HTTP path)
                pending.update(t.ident for t in threading.enumerate() if t is not threading.current_thread())
        else:
            state["on"] = False
            after = thread_cpu()
            used = {name: after[name] - state["cpu"].get(name, 0.0) for name in after}
            Path(os.environ[THREADS_ENV]).write_text(json.dumps(used))
            if profile_dir is not None:
                threading.setprofile(None)
                dump(profile_dir)

    original_run = cft._WorkItem.run

    def run(self: Any) -> None:
        if state["on"] and threading.get_ident() in pending:
            pending.discard(threading.get_ident())
            enable_here()
        original_run(self)

    try:
        from api.commands import CommandLane
    except ImportError:  # a tree from before the lane (--source)
        CommandLane = None  # type: ignore[assignment,misc]  # noqa: N806
    original_call = CommandLane.call if CommandLane is not None else None

    def in_lane(fn: Any) -> Any:
        def first_enables(*args: Any, **kwargs: Any) -> Any:
            if state["on"] and threading.get_ident() in pending:
                pending.discard(threading.get_ident())
                enable_here()
            return fn(*args, **kwargs)

        return first_enables

    async def call(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        assert original_call is not None
        return await original_call(self, in_lane(fn), *args, **kwargs)

    original_many = getattr(CommandLane, "call_many", None)  # a batch's sends (older trees: none)

    async def call_many(self: Any, calls: list[Any]) -> Any:
        assert original_many is not None
        return await original_many(self, [in_lane(fn) for fn in calls])

    if profile_dir is not None:
        cft._WorkItem.run = run  # type: ignore[method-assign]
        if CommandLane is not None:
            CommandLane.call = call  # type: ignore[method-assign]
            if original_many is not None:
                CommandLane.call_many = call_many  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, on_signal)
    return cli_main(argv)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        sys.path.insert(0, os.environ.get(SOURCE_ENV, str(ROOT)))
        sys.exit(harness_serve(sys.argv[2:]))
    sys.exit(main())
