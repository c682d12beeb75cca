"""SESSION_LIST_BATCH from the Cassandra views: a user in 5,000 conversations
logs in; how long until the first SESSION_LIST_BATCH frame, and until the last.

    .venv/bin/python bench/cassandra_sessions.py                       # 5,000 conversations, 20 logins
    .venv/bin/python bench/cassandra_sessions.py --conversations 300 --repeats 5   # smoke

Uses the engines in $FANOUT_ENGINES_DIR/engines.env with a fresh database, topic and keyspace of
its own (dropped at the end); the relay, one worker and `fanout serve` run as subprocesses.

The conversations are built through the distributed runtime, not written into the views by
hand: this process's API replica creates each one (the user and one other member) and the other
member sends one message in it, so every head has a latest seq, a preview and its own last
activity, and the user has one unread in each; the worker projects them into Cassandra
(user_states, heads). The gates are opened wide.

Measured, each --repeats times after one warm-up, p50 / p90 / max:

* WebSocket, what a client sees: `fanout serve`'s /v1/ws with the user's token; from the AUTH
  frame sent to the first SESSION_LIST_BATCH received, and to the one marked last (frames are
  produced lazily by `Queries.session_batches`, each read and encoded off the event loop,
  api/ws.py); the connection is opened before the clock starts. The client parses each frame
  with pydantic_core (a native parser, as a browser's JSON.parse; CPython's json took ~16 ms
  of this process's CPU a 5,000-session list, ADR-0042).
* The same reads on this process's replica, no network: `rt.queries.session_batches` (first
  frame, whole list: CassandraViews.sessions, the first frame from the login index, ADR-0028),
  and the two reads apart (the naive login and what the rest of the list still costs:
  projections/state.py sessions_by_two_reads): the user's states partition (from the login's
  copy, a cell a row, ADR-0043; and from user_states' columns as before it, alternating in the
  same loop, also the whole list that way), then the heads, concurrently, sorted by last activity.
  Also the CPU every process used meanwhile, and one head partition read alone (the same
  path, one conversation at a time, 500 times).
* The replicas' head cache (ADR-0035): the WebSocket's first login of the user finds no head
  cached (printed apart); the later ones find the heads the earlier read, none changed since.
  On the replica, the whole list is timed with the cache and without it (every head read from
  Cassandra, as the first login does: from the session heads' copy, ADR-0042), and without
  either (a partition a head, as before the copy); the breakdown is without the cache.
* GET /v1/me/sessions (the whole list in one HTTP answer).

--keep leaves the namespace in place and --reuse NAME measures it again without building it
(the worker started on it re-reads what its Kafka group has not committed: see its CPU line).

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed_common import (  # noqa: E402
    OPEN_GATES,
    TENANT,
    Fleet,
    Http,
    MemoryWatch,
    Namespace,
    exit_on_sigterm,
    user_token,
    wait_workers,
    watch_fleet,
)
from durability import distributed as durability_in_force  # noqa: E402

from fanout.bootstrap import bootstrap_distributed  # noqa: E402
from fanout.config import load_settings  # noqa: E402
from fanout.queries import FIRST_SESSION_BATCH, SESSION_BATCH  # noqa: E402

USER = "login-user"


def ms(values: list[float]) -> str:
    v = sorted(values)
    return (f"p50 {1000 * statistics.median(v):7.1f} ms  p90 {1000 * v[int(0.9 * (len(v) - 1))]:7.1f} ms  "
            f"max {1000 * v[-1]:7.1f} ms")  # fmt: skip


async def websocket_logins(base: str, repeats: int) -> tuple[list[float], list[float], int, int]:
    import aiohttp
    import pydantic_core

    token = user_token(USER)
    first, whole = [], []
    frames = sessions = 0
    async with aiohttp.ClientSession() as http:
        for _ in range(repeats + 1):  # the first is the warm-up
            async with http.ws_connect(base.replace("http", "ws", 1) + "/v1/ws", max_msg_size=0) as ws:
                t0 = time.perf_counter()
                await ws.send_json({"type": "AUTH", "token": token})
                frames = sessions = 0
                t_first = None
                while True:
                    frame = pydantic_core.from_json((await ws.receive(timeout=60)).data)
                    if frame["type"] == "AUTH_OK":
                        continue
                    if frame["type"] != "SESSION_LIST_BATCH":
                        raise RuntimeError(f"unexpected frame {frame}")
                    if t_first is None:
                        t_first = time.perf_counter()
                    frames += 1
                    sessions += len(frame["sessions"])
                    if frame["last"]:
                        break
                t_last = time.perf_counter()
            first.append(t_first - t0)
            whole.append(t_last - t0)
    return first, whole, frames, sessions


def build(rt: Any, conversations: int, spread_hours: float, behind: list[float]) -> None:
    """The user's `conversations` through the runtime `rt` (either runtime's): each created with
    the user and one other member, who sends one message in it; `behind[0]` is how far the
    runtime's clock is set back, so that their last activity spreads over `spread_hours`."""
    t = time.monotonic()
    for i in range(conversations):
        behind[0] = spread_hours * 3600.0 * (1.0 - i / conversations)
        cid, other = f"c{i:05d}", f"o{i:05d}"
        rt.app.create_conversation(TENANT, cid, f"conversation {i}", [USER, other])
        rt.app.send_message(TENANT, cid, sender=other, text=f"hello from {other}")
        if (i + 1) % 1000 == 0:
            print(f"  built {i + 1:,} conversations in {time.monotonic() - t:.0f} s", flush=True)
    behind[0] = 0.0
    built = time.monotonic() - t
    rt.wait_until(rt.log_position(), 1800)
    print(f"{conversations:,} conversations (create + one send each) through the runtime in "
          f"{built:.1f} s; the views held them {time.monotonic() - t:.1f} s after the first", flush=True)  # fmt: skip


def websocket_report(base: str, watch: MemoryWatch, args: argparse.Namespace, first_login: str) -> None:
    """The logins over the WebSocket (one warm-up, the user's first, then --repeats) and the CPU
    every watched process used a login."""
    ws_cpu0 = watch.cpu()
    first, whole, frames, sessions = asyncio.run(websocket_logins(base, args.repeats))
    ws_cpu = {name: (sec - ws_cpu0.get(name, 0.0)) / (args.repeats + 1) for name, sec in watch.cpu().items()}
    print(f"SESSION_LIST_BATCH for a user in {args.conversations:,} conversations ({sessions:,} sessions in "
          f"{frames} frames), {args.repeats} logins each; last activity over {args.spread_hours:g} hours:")  # fmt: skip
    print(f"  WebSocket (fanout serve)  {first_login}: first batch "
          f"{1000 * first[0]:.1f} ms, last batch {1000 * whole[0]:.1f} ms")  # fmt: skip
    print(f"                            AUTH sent -> first batch  {ms(first[1:])}")
    print(f"                            AUTH sent -> last batch   {ms(whole[1:])}")
    print("                            CPU a login (the warm-up's included): "
          + ", ".join(f"{name} {1000 * sec:.1f} ms" for name, sec in ws_cpu.items() if sec >= 0.0005))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--spread-hours",
        type=float,
        default=720.0,
        help="the conversations' last activity spread over this many past hours (default 720: a month); "
        "0: all of them now, as before the login index",
    )
    ap.add_argument("--keep", action="store_true", help="keep the namespace at the end (for --reuse)")
    ap.add_argument(
        "--reuse",
        metavar="NAMESPACE",
        help="measure the logins of a namespace a run with --keep built (same --conversations), without building it",
    )
    args = ap.parse_args()

    exit_on_sigterm()
    ns = Namespace(args.partitions, name=args.reuse)
    if args.reuse is None:
        ns.create()
    print(f"namespace {ns.name}{' (reused)' if args.reuse else ''}", flush=True)
    env = {**ns.urls, **OPEN_GATES}
    fleet = Fleet(ns.urls, OPEN_GATES)
    watch = MemoryWatch()
    rt = None
    try:
        # The replica's clock, set back while the conversations are built so that their last
        # activity spreads over --spread-hours (the login index reads the latest hours first).
        behind = [0.0]
        rt = bootstrap_distributed(load_settings(env), clock=lambda: time.time() - behind[0]).start()
        fleet.start_pipeline(1)
        base = fleet.start_serve().base
        watch_fleet(watch, fleet, "this process (replica)")
        watch.start()
        print(f"relay + 1 worker + fanout serve up in {wait_workers(rt, 1):.1f} s (logs {fleet.logs})", flush=True)
        print(durability_in_force(ns.urls), flush=True)

        build(rt, args.conversations if args.reuse is None else 0, args.spread_hours, behind)
        websocket_report(base, watch, args, "the user's first login (no head cached)")

        q_first, q_whole, q_uncached, q_full_first, states_t, heads_t = [], [], [], [], [], []
        q_uncopied: list[float] = []
        q_states_columns: list[float] = []
        states_columns_t: list[float] = []
        copy_from = rt.views.copy_read_from
        cache = rt.views.head_cache  # ADR-0035; None with head_cache=0 in FANOUT_VIEWS
        cpu0, w0 = watch.cpu(), time.time()
        for r in range(args.repeats + 1):
            t0 = time.perf_counter()
            batches = rt.queries.session_batches(TENANT, USER)
            next(batches)
            t1 = time.perf_counter()
            for _ in batches:
                pass
            t_whole = t2 = time.perf_counter()
            rt.views.head_cache = None  # the rest: every head read from Cassandra
            for _ in rt.queries.session_batches(TENANT, USER):
                pass
            if r:
                q_uncached.append(time.perf_counter() - t2)
            t2 = time.perf_counter()
            rt.views.copy_read_from = 10**9  # nor the session heads' copy: a partition each (before ADR-0042)
            for _ in rt.queries.session_batches(TENANT, USER):
                pass
            rt.views.copy_read_from = copy_from
            if r:
                q_uncopied.append(time.perf_counter() - t2)
            rt.views.read_states_copy = False  # the states from user_states' columns (before ADR-0043)
            rt.views.head_cache = cache
            t2 = time.perf_counter()
            for _ in rt.queries.session_batches(TENANT, USER):
                pass
            t3 = time.perf_counter()
            rt.views.session_states(TENANT, USER)
            rt.views.read_states_copy = True
            rt.views.head_cache = None  # as the reads below were measured before
            if r:
                q_states_columns.append(t3 - t2)
                states_columns_t.append(time.perf_counter() - t3)
            t2 = time.perf_counter()
            # the first frame as it was before ADR-0028's amendment (500 sessions)
            full = rt.queries.session_batches(TENANT, USER, first=SESSION_BATCH)
            next(full)
            if r:
                q_full_first.append(time.perf_counter() - t2)
            full.close()
            t2 = time.perf_counter()
            states = rt.views.session_states(TENANT, USER)  # what the login reads of them
            t3 = time.perf_counter()
            for _ in rt.views.heads(TENANT, list(states), 500):
                pass
            t4 = time.perf_counter()
            rt.views.head_cache = cache
            if r:
                q_first.append(t1 - t0)
                q_whole.append(t_whole - t0)
                states_t.append(t3 - t2)
                heads_t.append(t4 - t3)
        cpu_line = watch.cpu_report(cpu0, watch.cpu(), time.time() - w0)
        one = []
        rt.views.head_cache = None  # read from Cassandra
        for i in range(min(args.conversations, 500)):
            t0 = time.perf_counter()
            for _ in rt.views.heads(TENANT, [f"c{i:05d}"], 1):
                pass
            one.append(time.perf_counter() - t0)
        rt.views.head_cache = cache
        print(f"  Queries on a replica      first frame ({FIRST_SESSION_BATCH})         {ms(q_first)}")
        print(f"                            a first frame of {SESSION_BATCH}      {ms(q_full_first)}")
        print(f"                            whole list                {ms(q_whole)}")
        print(
            f"                            ... states from columns   {ms(q_states_columns)}  (user_states, before ADR-0043)"
        )
        print(
            f"                            whole list, no head cache {ms(q_uncached)}  (the heads from the session heads' copy)"
        )
        print(
            f"                            ... nor the copy          {ms(q_uncopied)}  (a partition each, before ADR-0042)"
        )
        if cache is not None:
            st = cache.stats
            print(f"    head cache (ADR-0035): {st.hits:,} heads served, {st.misses:,} read, {st.dropped} dropped by "
                  f"records, {st.resets} resets, {st.bypassed} logins it stood aside")  # fmt: skip
        print(
            f"    of which: the user's states ({len(states):,} rows)  {ms(states_t)}  "
            f"({'the copy, a cell a row' if rt.views.states_copy_vouched() else 'NOT VOUCHED: user_states'})"
        )
        print(f"              from user_states' columns    {ms(states_columns_t)}  (before ADR-0043)")
        print(f"              {len(states):,} heads from the copy, concurrently  {ms(heads_t)}")
        print(f"    one head partition read alone, {len(one)} times one after another: {ms(one)}")
        quick = rt.views.first_sessions(TENANT, USER, FIRST_SESSION_BATCH)
        first, complete = quick if quick is not None else (None, False)
        print(f"    the login index's first list: {'none (the two reads answered)' if first is None else len(first)} "
              f"sessions read for a frame of {FIRST_SESSION_BATCH}{' (all of them)' if complete else ''}")  # fmt: skip
        print(f"    {cpu_line}", flush=True)

        http = Http(base, user_token(USER))
        got = []
        for r in range(args.repeats + 1):
            t0 = time.perf_counter()
            status, body = http.call("GET", "/v1/me/sessions")
            if r:
                got.append(time.perf_counter() - t0)
        n = len(body["sessions"]) if status == 200 else f"status {status}"
        print(f"  GET /v1/me/sessions       whole list ({n} sessions)   {ms(got)}", flush=True)
        print(watch.report(), flush=True)
    finally:
        watch.stop.set()
        fleet.stop()
        if rt is not None:
            rt.close()
        if args.keep:
            print(
                f"kept namespace {ns.name}: measure it again with --reuse {ns.name} (dropped at the end without --keep)"
            )
        else:
            for problem in ns.drop():
                print(f"not dropped: {problem}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
