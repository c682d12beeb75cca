"""MARK_READ at scale (ADR-0018): N members of one 100k-member group mark read
at once through two API replicas (`FanoutApplication(shared_store=True)`) on one PostgreSQL
event store, while a sender keeps sending into the same conversation, OLD versus NEW in the
same run:

* OLD: every MARK_READ appends Conversation.ReadMarked to the conversation's stream (the code
  path before ADR-0018, kept behind `legacy_read_marks` for this bench): the reads and the
  sends serialise on one stream, and the replicas lose optimistic-concurrency races (retried).
* NEW: every MARK_READ appends to the member's MemberReadState stream; the members' activity
  (they were silent: every read is an activity refresh) is group-committed as
  Conversation.MembersActive, at most one per replica per conversation per 0.2 s.

    .venv/bin/python bench/mark_read_scale.py                        # 2,000 readers, 100k members
    .venv/bin/python bench/mark_read_scale.py --readers 4000         # the numbers in ADR-0018

Creates a fresh database on --postgres (default postgresql://postgres@127.0.0.1:15432) and drops
it at the end. The admission gates are opened wide (conversation rate, per-sender rate, tenant
quota): the bench measures the event store, not the gates. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from domain.conversation import Conversation  # noqa: E402
from domain.errors import FanoutError  # noqa: E402
from domain.params import Parameters, Rate  # noqa: E402
from fanout.application import FanoutApplication  # noqa: E402
from fanout.bootstrap import postgres_event_store  # noqa: E402

T = "bench"


def with_path(url: str, path: str) -> str:
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, "/" + path, u.query, ""))


def conversation_events(app: FanoutApplication, cid: str) -> int:
    rows = list(app.recorder.select_events(Conversation.create_id(T, cid), desc=True, limit=1))
    return rows[0].originator_version if rows else 0


def phase(apps: list[FanoutApplication], cid: str, readers: list[str], threads: int, legacy: bool) -> dict[str, Any]:
    """Every reader marks read once (round-robin over the replicas, `threads` threads per
    replica), while one thread sends into the same conversation through replica 0."""
    for app in apps:
        app.legacy_read_marks = legacy
    latest = apps[0].conversation(T, cid).seq
    conflicts0 = sum(app.conflicts for app in apps)
    activity0 = sum(app.activity_events for app in apps)
    version0 = conversation_events(apps[0], cid)
    queues = [readers[i :: len(apps) * threads] for i in range(len(apps) * threads)]
    read_latency: list[float] = []
    failed: list[str] = []
    stop = threading.Event()
    sends: list[float] = []
    send_failed: list[str] = []
    lock = threading.Lock()

    def read(app: FanoutApplication, users: list[str]) -> None:
        mine: list[float] = []
        for u in users:
            t0 = time.perf_counter()
            try:
                app.mark_read(T, cid, u, latest)
            except FanoutError as exc:
                with lock:
                    failed.append(exc.code)
                continue
            mine.append(time.perf_counter() - t0)
        with lock:
            read_latency.extend(mine)

    def send() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            t0 = time.perf_counter()
            try:
                apps[0].send_message(T, cid, sender=f"s{n % 50}", text=f"while reading {n}")
            except FanoutError as exc:
                send_failed.append(exc.code)
                continue
            sends.append(time.perf_counter() - t0)

    workers = [
        threading.Thread(target=read, args=(apps[i % len(apps)], q)) for i, q in enumerate(queues)
    ]
    sender = threading.Thread(target=send)
    start = time.perf_counter()
    sender.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    stop.set()
    sender.join()
    send_elapsed = time.perf_counter() - start
    flush_start = time.perf_counter()
    for app in apps:
        app.flush_activity()
    flush = time.perf_counter() - flush_start
    read_latency.sort()
    sends.sort()
    return {
        "mode": "OLD (Conversation.ReadMarked)" if legacy else "NEW (MemberReadState)",
        "reads": len(read_latency),
        "failed": len(failed),
        "seconds": elapsed,
        "reads_per_s": len(read_latency) / elapsed,
        "read_p50_ms": 1000 * statistics.median(read_latency) if read_latency else float("nan"),
        "read_p99_ms": 1000 * read_latency[int(0.99 * (len(read_latency) - 1))] if read_latency else float("nan"),
        "conflicts": sum(app.conflicts for app in apps) - conflicts0,
        "conversation_appends": conversation_events(apps[0], cid) - version0,
        # saved MembersActive events; most ride on the sends' own saves (no extra append)
        "members_active_events": sum(app.activity_events for app in apps) - activity0,
        "sends": len(sends),
        "send_failed": len(send_failed),
        "sends_per_s": len(sends) / send_elapsed,
        "send_p50_ms": 1000 * statistics.median(sends) if sends else float("nan"),
        "send_p99_ms": 1000 * sends[int(0.99 * (len(sends) - 1))] if sends else float("nan"),
        "final_flush_s": flush,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:15432")
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--readers", type=int, default=2_000)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4, help="reader threads per replica")
    args = ap.parse_args()

    import psycopg

    name = f"bench_reads_{uuid.uuid4().hex[:8]}"
    admin = with_path(args.postgres, "postgres")
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = Parameters(
        rate_large=100_000.0,
        per_sender_in_conversation_rate=Rate(100_000, 1.0),
        tenant_fanout_quota_capacity=1e15,
        tenant_fanout_quota_refill_per_sec=1e15,
    )
    env = postgres_event_store(with_path(args.postgres, name))
    apps: list[FanoutApplication] = []
    try:
        apps = [FanoutApplication(params, dict(env), shared_store=True) for _ in range(args.replicas)]
        senders = [f"s{i}" for i in range(50)]
        members = [f"m{i:06d}" for i in range(args.members - len(senders))]
        t0 = time.perf_counter()
        for cid in ("old", "new"):
            apps[0].create_conversation(T, cid, cid, senders)
            for i in range(0, len(members), 20_000):
                apps[0].add_members(T, cid, members[i : i + 20_000])
            apps[0].send_message(T, cid, sender="s0", text="an announcement everyone reads")
            for app in apps[1:]:
                app.conversation(T, cid)  # warm every replica's cache, as a running replica has it
        print(
            f"setup: 2 conversations of {len(members) + len(senders):,} members in {time.perf_counter() - t0:.1f} s; "
            f"{args.readers:,} readers, {args.replicas} replicas x {args.threads} reader threads, 1 sender thread"
        )
        readers = members[: args.readers]
        results = [
            phase(apps, "old", readers, args.threads, legacy=True),
            phase(apps, "new", readers, args.threads, legacy=False),
        ]
        keys = [k for k in results[0] if k != "mode"]
        print(f"{'':24}" + "".join(f"{r['mode']:>32}" for r in results))
        for k in keys:
            cells = "".join(
                f"{r[k]:>32,.1f}" if isinstance(r[k], float) else f"{r[k]:>32,}" for r in results
            )
            print(f"{k:24}{cells}")
    finally:
        for app in apps:
            app.close()
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
