"""Many small groups on the distributed runtime: sends accepted per second by
API replicas on the PostgreSQL event store, and how fast the relay and the workers project them
into Cassandra. The embedded runtime's number is bench/small_groups.py (one writer, ~1,100
sends/s on this machine: docs/PERFORMANCE.md section 6).

    .venv/bin/python bench/distributed_small_groups.py                          # 1,000 groups of 20, 5,000 sends
    .venv/bin/python bench/distributed_small_groups.py --replicas 2 --tenants 2
    .venv/bin/python bench/distributed_small_groups.py --groups 50 --messages 300   # smoke
    .venv/bin/python bench/distributed_small_groups.py --group 32    # 32 sends a PostgreSQL transaction

--rate R: the replicas together send R messages/s (paced; default: as fast as they can), and the
lag of the views behind the log is sampled every 0.5 s while they send: at a rate the
projection sustains, the lag of the second half of the run is no higher than the first's.

--restart-worker: after the run, worker-1 is stopped and started again in its consumer group, and
one more send is timed through it; prints what the new worker was handed again (ADR-0044).

--users N: the members are drawn from N users (group g's i-th member is user (g * members + i)
% N: with N = groups * members, every group has members of its own, each user in one
conversation); by default every group has the same members u0..u<members-1> (each user in every
conversation), the shape of the sections before PERFORMANCE.md section 29: it puts a message's
mailbox entries in the same few Cassandra partitions as every other message's.

--group N: each replica sends N at a time through `FanoutApplication.grouped`, one event-store
transaction for the N (ADR-0030), as the HTTP command lane does with the sends queued behind
one; 1 (the default) is one transaction per send.

Uses the engines in $FANOUT_ENGINES_DIR/engines.env with a fresh database, topic and keyspace
of its own (dropped at the end); the relay and --workers workers run as subprocesses. The
groups are created through this process's replica and projected first. Then --replicas API
replicas, each a process of its own built as `fanout serve` builds one
(`bootstrap_distributed`), each sending from one thread (a replica runs its commands under one
lock), send --messages in all, round-robin over their own groups (replica j sends to the
groups g with g % replicas == j: no two replicas race on a conversation). The groups are spread
over --tenants tenants: every send also appends to its tenant's quota stream, so replicas of one
tenant race on that stream (the conflicts are counted and retried). Sends go through the
application (`rt.app.send_message`), not HTTP, as bench/small_groups.py does. The gates are
opened wide and the clock is real. Projection: from the first send until this process's
replica sees the views hold the last one; with --pause-workers the workers are stopped
(SIGSTOP) while the replicas send, so the command side has the cores to itself, and resumed
(SIGCONT) after: the projection is then timed from the resume (a paused worker misses its
Kafka session timeout, so this includes its rejoin). The CPU every process used is printed.
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import queue
import shlex
import signal
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed_common import (  # noqa: E402
    OPEN_GATES,
    Fleet,
    MemoryWatch,
    Namespace,
    cassandra_writes,
    exit_on_sigterm,
    proc_status,
    wait_workers,
    watch_fleet,
    writes_report,
)
from durability import distributed as durability_in_force  # noqa: E402
from group_members import add_users_option  # noqa: E402
from group_members import member as group_member  # noqa: E402

from fanout.bootstrap import bootstrap_distributed  # noqa: E402
from fanout.config import load_settings  # noqa: E402


def tenant_of(g: int, tenants: int) -> str:
    return f"bench{g % tenants}"


def replica(j: int, env: dict[str, str], args: dict[str, int], go: Any, out: Any) -> None:
    """One API replica process: warm its groups, wait for `go`, send its share; puts
    ("done", j, start, end, latencies of the accepted sends, last position, conflicts retried,
    refusals by code, VmHWM KiB) or ("failed", j, error)."""
    try:
        from domain.errors import FanoutError

        rt = bootstrap_distributed(load_settings(env))
        try:
            mine = [g for g in range(args["groups"]) if g % args["replicas"] == j]
            for g in mine:  # a running replica has its conversations cached
                rt.app.conversation(tenant_of(g, args["tenants"]), f"g{g}")
            share = args["messages"] // args["replicas"] + (1 if j < args["messages"] % args["replicas"] else 0)
            out.put(("ready", j))
            go.wait()
            latencies: list[float] = []
            refused: dict[str, int] = {}
            last = 0
            t0 = time.time()
            size = args["group"]
            pace = args["rate"] / args["replicas"] if args["rate"] else 0.0  # messages/s of this replica
            for first in range(0, share, size):
                if pace:
                    time.sleep(max(0.0, t0 + first / pace - time.time()))
                calls = []
                for i in range(first, min(first + size, share)):
                    g = mine[i % len(mine)]
                    calls.append(
                        partial(
                            rt.app.send_message,
                            tenant_of(g, args["tenants"]),
                            f"g{g}",
                            sender=member(g, i % args["members"], args),
                            text="hi",
                        )
                    )
                t = time.perf_counter()
                outcomes = rt.app.grouped(calls)
                took = time.perf_counter() - t
                for r, exc in outcomes:
                    if isinstance(exc, FanoutError):  # e.g. UNAVAILABLE: every retry lost the race
                        refused[exc.code] = refused.get(exc.code, 0) + 1
                        continue
                    if exc is not None:
                        raise exc
                    latencies.append(took)
                    last = max(last, int(r["position"]))
            end = time.time()
            hwm = proc_status(os.getpid()).get("VmHWM", 0)
            out.put(("done", j, t0, end, latencies, last, rt.app.conflicts, refused, hwm))
        finally:
            rt.close()
    except BaseException as exc:
        out.put(("failed", j, f"{type(exc).__name__}: {exc}"))
        raise


def member(g: int, i: int, args: dict[str, Any]) -> str:
    """Group g's i-th member (--users)."""
    return group_member(g, i, args["members"], args["users"])


def lag_trend(lags: list[tuple[float, int]]) -> str:
    """The lag's medians by quarter of the run and its least-squares slope over the second
    half (events a minute): a sustained rate shows a slope near zero once the run has warmed up,
    a rate beyond the projection one that keeps rising."""
    quarters = [lags[len(lags) * q // 4 : len(lags) * (q + 1) // 4] for q in range(4)]
    medians = " / ".join(f"{statistics.median(lag for _, lag in q):,.0f}" if q else "-" for q in quarters)
    tail = lags[len(lags) // 2 :]
    if len(tail) < 3:
        return f"lag trend: medians by quarter {medians}"
    slope = statistics.linear_regression([t for t, _ in tail], [float(lag) for _, lag in tail]).slope
    return (f"lag trend: medians by quarter {medians}; second half's least-squares slope "
            f"{60 * slope:+,.0f} events a minute over {tail[-1][0] - tail[0][0]:.0f} s")  # fmt: skip


def sample_lag(rt: Any, lags: list[tuple[float, int]], sending: threading.Event) -> None:
    """Every 0.5 s while `sending`: how many log positions the views are behind the log."""
    while sending.is_set():
        with contextlib.suppress(Exception):  # a sample missed; the bench goes on
            lags.append((time.time(), max(0, rt.log_position() - rt.position())))
        time.sleep(0.5)


def collect(out: Any, children: list[Any], kind: str, timeout: float) -> list[Any]:
    """One message per child; raises if a child failed, or ended without one."""
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(children):
        try:
            msg = out.get(timeout=1)
        except queue.Empty:
            silent = [j for j, p in enumerate(children) if j not in got and not p.is_alive()]
            if silent or time.monotonic() > deadline:
                raise RuntimeError(f"replica(s) {silent or 'all'} stopped or timed out before {kind}") from None
            continue
        if msg[0] == "failed":
            raise RuntimeError(f"replica {msg[1] + 1} failed: {msg[2]}")
        got[msg[1]] = msg
    return list(got.values())


def restart_worker(rt: Any, fleet: Fleet, watch: MemoryWatch, tenant: str) -> None:
    """worker-1 stopped and started again in its consumer group; one more send timed until the
    views hold it, and what the new worker was handed again (ADR-0044: where the group's
    committed offsets stood)."""
    fleet.kill("worker-1", signal.SIGTERM)
    again = fleet.start("worker-1-again", "cli.worker")
    watch.watch("worker-1-again", partial(list, [again.pid]))
    cpu0, t0 = watch.cpu(), time.time()
    rt.app.send_message(tenant, "g0", sender="u0", text="after the restart")
    rt.wait_until(rt.log_position(), 600)
    took, cpu1 = time.time() - t0, watch.cpu()
    fleet.kill("worker-1-again", signal.SIGTERM)
    stopped = [line for line in fleet.tail("worker-1-again", 100_000).splitlines() if "worker stopped:" in line]
    print(f"  worker-1 restarted: the views held one more send {took:.2f} s after the restart; "
          f"{stopped[-1].split('worker stopped: ', 1)[-1] if stopped else 'no stop line'}")  # fmt: skip
    print("  restart:   " + watch.cpu_report(cpu0, cpu1, took), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--members", type=int, default=20)
    add_users_option(ap)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--replicas", type=int, default=1, help="API replica processes sending")
    ap.add_argument("--tenants", type=int, default=1, help="tenants the groups are spread over")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--group", type=int, default=1, help="sends per event-store transaction (ADR-0030)")
    ap.add_argument("--rate", type=float, default=0.0, help="messages/s the replicas send together (0: unpaced)")
    ap.add_argument("--pause-workers", action="store_true", help="SIGSTOP the workers while the replicas send "
                    "(the command side alone on the cores), SIGCONT after; the projection is timed from then")  # fmt: skip
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--restart-worker", action="store_true", help="after the run, stop worker-1 (SIGTERM), start "
                    "it again in the same consumer group and time one more send through it (ADR-0044)")  # fmt: skip
    ap.add_argument(
        "--relay-args", default="", help="more arguments for `fanout relay` (e.g. '--commit-interval-ms 50')"
    )
    ap.add_argument("--worker-args", default="", help="more arguments for each `fanout worker` (e.g. '--within 0.1')")
    args = ap.parse_args()

    exit_on_sigterm()
    ns = Namespace(args.partitions)
    ns.create()
    print(f"namespace {ns.name}", flush=True)
    env = {**ns.urls, **OPEN_GATES}
    fleet = Fleet(ns.urls, OPEN_GATES)
    watch = MemoryWatch()
    rt = None
    children: list[Any] = []
    try:
        rt = bootstrap_distributed(load_settings(env)).start()
        fleet.start_pipeline(args.workers, shlex.split(args.relay_args), shlex.split(args.worker_args))
        watch_fleet(watch, fleet, "this process (set-up replica)")
        watch.start()
        print(f"relay + {args.workers} worker(s) up in {wait_workers(rt, args.workers):.1f} s "
              f"(logs {fleet.logs})", flush=True)  # fmt: skip
        print(durability_in_force(ns.urls), flush=True)

        t = time.monotonic()
        for g in range(args.groups):
            members = [member(g, i, vars(args)) for i in range(args.members)]
            rt.app.create_conversation(tenant_of(g, args.tenants), f"g{g}", "", members)
        created = time.monotonic() - t
        rt.wait_until(rt.log_position(), 1800)
        print(f"{args.groups} groups of {args.members} created in {created:.1f} s "
              f"({args.groups / created:,.0f} creates/s), projected {time.monotonic() - t:.1f} s after the first",
              flush=True)  # fmt: skip

        ctx = mp.get_context("spawn")
        go, out = ctx.Event(), ctx.Queue()
        shared = {
            k: getattr(args, k)
            for k in ("groups", "members", "users", "messages", "replicas", "tenants", "group", "rate")
        }
        for j in range(args.replicas):
            p = ctx.Process(target=replica, args=(j, env, shared, go, out), name=f"replica-{j + 1}")
            p.start()
            children.append(p)
            watch.watch(f"replica-{j + 1} (process)", partial(list, [p.pid]))
        collect(out, children, "ready", 600)
        workers = [p for name, p in fleet.procs.items() if name.startswith("worker")]
        if args.pause_workers:
            for w in workers:
                os.kill(w.pid, signal.SIGSTOP)
        writes0 = cassandra_writes(rt.views.session, rt.views.keyspace)
        cpu0, c0 = watch.cpu(), time.time()
        lags: list[tuple[float, int]] = []  # (time, log position - views' position) while the replicas send
        sending = threading.Event()
        sampler = threading.Thread(target=sample_lag, args=(rt, lags, sending), daemon=True)
        sending.set()
        sampler.start()
        go.set()
        done = collect(out, children, "done", 3600)
        sending.clear()
        sampler.join(5)
        for p in children:
            p.join(60)
        start = min(d[2] for d in done)
        end = max(d[3] for d in done)
        latencies = sorted(x for d in done for x in d[4])
        last = max(d[5] for d in done)
        cpu_sent = watch.cpu()
        resumed = time.time()
        if args.pause_workers:
            for w in workers:
                os.kill(w.pid, signal.SIGCONT)
        rt.wait_until(last, 3600)
        projected = time.time()
        cpu1 = watch.cpu()
        writes1 = cassandra_writes(rt.views.session, rt.views.keyspace)
        n = len(latencies)
        refused: dict[str, int] = {}
        for d in done:
            for code, k in d[7].items():
                refused[code] = refused.get(code, 0) + k
        print(f"{args.groups} groups of {args.members}, {args.tenants} tenant(s): {n} sends accepted through "
              f"{args.replicas} replica(s), one thread each, {args.workers} worker(s); refused: {refused or 'none'}")  # fmt: skip
        print(f"  command side  {n / (end - start):,.0f} sends accepted/s (p50 {1000 * statistics.median(latencies):.1f} ms, "
              f"p99 {1000 * latencies[int(0.99 * (n - 1))]:.1f} ms per send; "
              f"{sum(d[6] for d in done)} optimistic-concurrency conflicts retried)")  # fmt: skip
        if args.pause_workers:
            print(f"  projection    (the workers paused while the replicas sent, resumed after) the views held the "
                  f"last send {projected - resumed:.2f} s after the workers resumed: "
                  f"{n / (projected - resumed):,.0f} messages/s = {n * args.members / (projected - resumed):,.0f} "
                  "entries/s (including the workers' rejoin of the consumer group)", flush=True)  # fmt: skip
            print("  sending:   " + watch.cpu_report(cpu0, cpu_sent, resumed - c0), flush=True)
            print("  projecting: " + watch.cpu_report(cpu_sent, cpu1, projected - resumed), flush=True)
        else:
            print(f"  projection    views hold the last send {projected - end:.2f} s after it was accepted: "
                  f"{n / (projected - start):,.0f} messages/s = {n * args.members / (projected - start):,.0f} "
                  "entries/s from the first send to the views holding the last", flush=True)  # fmt: skip
            print("  " + watch.cpu_report(cpu0, cpu1, projected - c0), flush=True)
        print("  " + writes_report(writes0, writes1, n), flush=True)
        if lags:
            half = len(lags) // 2
            first_half = [lag for _, lag in lags[:half]] or [0]
            second_half = [lag for _, lag in lags[half:]]
            print(f"  lag of the views while sending ({len(lags)} samples, events behind the log): median "
                  f"{statistics.median(first_half):,.0f} in the first half, {statistics.median(second_half):,.0f} in "
                  f"the second; max {max(lag for _, lag in lags):,}"
                  + (f" (paced at {args.rate:,.0f} messages/s)" if args.rate else ""), flush=True)  # fmt: skip
            print("  " + lag_trend(lags), flush=True)
        if args.restart_worker:
            restart_worker(rt, fleet, watch, tenant_of(0, args.tenants))
        print(watch.report(), flush=True)
        for d in sorted(done, key=lambda d: d[1]):
            print(f"  replica-{d[1] + 1} (process)   VmHWM {d[8] / 1024:,.0f} MiB (its own, at its end)")
    finally:
        watch.stop.set()
        for p in children:
            if p.is_alive():
                p.terminate()
        fleet.stop()
        if rt is not None:
            rt.close()
        for problem in ns.drop():
            print(f"not dropped: {problem}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
