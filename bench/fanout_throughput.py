"""Fan-out benchmark of the embedded runtime, against the naive writer, in one run.

    .venv/bin/python bench/fanout_throughput.py                 # the numbers in docs/PERFORMANCE.md
    .venv/bin/python bench/fanout_throughput.py --members 20000 --prefill-messages 10   # quick look

What it does, all through the real code (event store, projection runner, views):
 1. a group of --members members; --prefill-messages messages so the mailbox already
    holds members x prefill entries (10M by default) before anything is measured;
 2. throughput: --messages messages appended, then projected; mailbox entries/s;
 3. latency: messages sent one at a time with the projector thread running; time
    from the send being accepted to the delivery record's materialized_at;
 4. inbox reads by user (a key-prefix seek) at that size;
 5. the naive writer on the same machine in the same run: SQLite, a user-keyed
    B-tree prefilled to the same size, one INSERT per member plus a per-member
    unread counter upsert; and the ratio;
 6. SESSION_LIST_BATCH for a user in --sessions conversations.
A fake clock is advanced between sends so admission gates admit them (the gates are
measured by the test suite, not here). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import resource
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from domain.params import Parameters, Rate
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from fanout.embedded import EmbeddedRuntime


def rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def params_for_bench(members: int) -> Parameters:
    return dataclasses.replace(
        Parameters(),
        max_group_members=max(members, 100_000),
        tenant_fanout_quota_capacity=1e12,
        tenant_fanout_quota_refill_per_sec=1e12,
        per_sender_in_conversation_rate=Rate(1, 3.0),
    )


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def send(rt: EmbeddedRuntime, clock: Clock, cid: str, i: int, members: int) -> int:
    clock.advance(3.1)  # past the large-group rate (2 msg/s) and the sender rate (1 / 3 s)
    r = rt.app.send_message("bench", cid, sender=f"u{i % members:06d}", text=f"benchmark message {i}")
    return int(r["conversation_seq"])


def bench_fanout(args: argparse.Namespace, root: Path) -> dict[str, float]:
    clock = Clock()
    rt = bootstrap(Settings.embedded(root / "fanout", params_for_bench(args.members)), clock=clock)
    users = [f"u{i:06d}" for i in range(args.members)]
    rt.app.create_conversation("bench", "big", "benchmark group", users)
    rt.runner.catch_up()

    t0 = time.perf_counter()
    for i in range(args.prefill_messages):
        send(rt, clock, "big", i, args.members)
        if i % 10 == 9:
            rt.runner.catch_up()
        print(f"\rprefill {i + 1}/{args.prefill_messages} messages", end="", file=sys.stderr)
    rt.runner.catch_up()
    prefill_s = time.perf_counter() - t0
    stored = args.members * args.prefill_messages
    print(f"\rprefill: {stored:,} mailbox entries in {prefill_s:.1f}s", file=sys.stderr)

    # 2. throughput: append N messages, then project them
    for i in range(args.messages):
        send(rt, clock, "big", args.prefill_messages + i, args.members)
    t0 = time.perf_counter()
    rt.runner.catch_up()
    elapsed = time.perf_counter() - t0
    entries = args.members * args.messages
    out = {"stored_before": stored, "entries": entries, "seconds": elapsed, "entries_per_s": entries / elapsed}

    # 3. latency: accepted -> materialized_at, projector thread running
    rt.start()
    lat = []
    for i in range(args.latency_messages):
        seq = send(rt, clock, "big", 10_000 + i, args.members)
        t_acc = time.time()
        while True:
            rec = rt.views.delivery("bench", "big", seq)
            if rec is not None and rec["materialized_at"] is not None:
                lat.append((time.time() - t_acc) * 1000)
                break
            time.sleep(0.001)
    out["latency_ms_p50"] = statistics.median(lat)
    out["latency_ms_max"] = max(lat)
    rt.wait_until(rt.log_position())

    # 4. inbox reads by user at this size
    reads = []
    rnd = random.Random(7)
    for _ in range(1000):
        u = users[rnd.randrange(len(users))]
        t0 = time.perf_counter()
        page = rt.queries.mailbox("bench", u, 0, 200)
        reads.append((time.perf_counter() - t0) * 1e6)
        assert len(page["entries"]) == min(200, args.prefill_messages + args.messages + args.latency_messages)
    reads.sort()
    out["inbox_read_us_p50"] = reads[len(reads) // 2]
    out["inbox_read_us_p99"] = reads[int(len(reads) * 0.99)]
    out["rss_peak_mib"] = rss_peak_mib()
    rt.close()
    return out


def bench_naive(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """One INSERT per member and a per-member unread counter upsert, into a
    user-keyed B-tree holding the same number of rows."""
    path = root / "naive.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute(
        "CREATE TABLE mailbox (tenant TEXT, user_id TEXT, pos INTEGER, conversation_seq INTEGER, "
        "conversation_id TEXT, flags INTEGER, PRIMARY KEY (tenant, user_id, pos)) WITHOUT ROWID"
    )
    con.execute(
        "CREATE TABLE state (tenant TEXT, user_id TEXT, conversation_id TEXT, unread INTEGER, "
        "PRIMARY KEY (tenant, user_id, conversation_id)) WITHOUT ROWID"
    )
    users = [f"u{i:06d}" for i in range(args.members)]
    con.execute("BEGIN")
    for u in users:  # bulk prefill in key order (fast path, not measured)
        con.executemany(
            "INSERT INTO mailbox VALUES ('bench', ?, ?, ?, 'big', 0)",
            [(u, m, m) for m in range(1, args.prefill_messages + 1)],
        )
    con.executemany("INSERT INTO state VALUES ('bench', ?, 'big', 0)", [(u,) for u in users])
    con.execute("COMMIT")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    t0 = time.perf_counter()
    for m in range(args.naive_messages):
        pos = args.prefill_messages + 1 + m
        con.execute("BEGIN")
        for u in users:
            con.execute("INSERT INTO mailbox VALUES ('bench', ?, ?, ?, 'big', 0)", (u, pos, pos))
            con.execute(
                "UPDATE state SET unread = unread + 1 WHERE tenant='bench' AND user_id=? AND conversation_id='big'",
                (u,),
            )
        con.execute("COMMIT")
        print(f"\rnaive {m + 1}/{args.naive_messages} messages", end="", file=sys.stderr)
    elapsed = time.perf_counter() - t0
    print(file=sys.stderr)
    con.close()
    entries = args.members * args.naive_messages
    return {"entries": entries, "seconds": elapsed, "entries_per_s": entries / elapsed}


def bench_sessions(args: argparse.Namespace, root: Path) -> dict[str, float]:
    clock = Clock()
    rt = bootstrap(Settings.embedded(root / "sessions", params_for_bench(10)), clock=clock)
    for i in range(args.sessions):
        cid = f"c{i:05d}"
        rt.app.create_conversation("bench", cid, f"group {i}", ["heavy", f"x{i}", f"y{i}"])
        clock.advance(0.01)
        rt.app.send_message("bench", cid, sender=f"x{i}", text=f"hello {i}", mentions=["heavy"] if i % 7 == 0 else [])
        if i % 500 == 499:
            rt.runner.catch_up()
            print(f"\rsessions setup {i + 1}/{args.sessions}", end="", file=sys.stderr)
    rt.runner.catch_up()
    print(file=sys.stderr)
    firsts, wholes = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        batches = rt.queries.session_batches("bench", "heavy")
        frames = [next(batches)]
        t1 = time.perf_counter()
        frames.extend(batches)
        t2 = time.perf_counter()
        firsts.append((t1 - t0) * 1000)
        wholes.append((t2 - t0) * 1000)
        assert sum(len(f["sessions"]) for f in frames) == args.sessions
        assert frames[-1]["last"] and not any(f["last"] for f in frames[:-1])
    rt.close()
    return {"first_batch_ms_p50": statistics.median(firsts), "whole_list_ms_p50": statistics.median(wholes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--prefill-messages", type=int, default=100, help="members x this = entries stored first")
    ap.add_argument("--messages", type=int, default=20, help="messages in the throughput phase")
    ap.add_argument("--latency-messages", type=int, default=10)
    ap.add_argument("--naive-messages", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=5000)
    ap.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir, removed)")
    ap.add_argument("--skip-naive", action="store_true")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    try:
        f = bench_fanout(args, root)
        print(f"\nfan-out, {args.members:,}-member group, {f['stored_before']:,} entries already stored")
        print(f"  throughput   {f['entries']:,} entries in {f['seconds']:.2f}s = {f['entries_per_s']:,.0f} entries/s")
        print(f"  latency      accepted -> materialized_at p50 {f['latency_ms_p50']:.0f} ms, max {f['latency_ms_max']:.0f} ms")
        print(f"  inbox read   200 entries by user p50 {f['inbox_read_us_p50']:.0f} us, p99 {f['inbox_read_us_p99']:.0f} us")
        print(f"  peak RSS     {f['rss_peak_mib']:.0f} MiB (this process: runtime + projector)")
        if not args.skip_naive:
            n = bench_naive(args, root)
            print(f"naive writer (SQLite, one INSERT + one counter UPDATE per member, {f['stored_before']:,} rows)")
            print(f"  throughput   {n['entries']:,} entries in {n['seconds']:.2f}s = {n['entries_per_s']:,.0f} entries/s")
            print(f"  ratio        {f['entries_per_s'] / n['entries_per_s']:.1f}x")
        s = bench_sessions(args, root)
        print(f"SESSION_LIST_BATCH, user in {args.sessions:,} conversations")
        print(f"  first batch  {s['first_batch_ms_p50']:.1f} ms p50; whole list {s['whole_list_ms_p50']:.1f} ms p50")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
