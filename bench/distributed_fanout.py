"""Fan-out through the distributed runtime on the real engines, end to end: send
accepted by an API replica (PostgreSQL) -> `fanout relay` (Kafka transaction) -> `fanout worker`
(Faust, Cassandra views and mailbox) -> the delivery record's materialized_at.

    .venv/bin/python bench/distributed_fanout.py --http --preload 10000000      # 10M entries stored
    .venv/bin/python bench/distributed_fanout.py --http --workers 2 --preload 10000000
    .venv/bin/python bench/distributed_fanout.py --http --members 2000 --messages 3 --preload 20000   # smoke

Uses the engines in $FANOUT_ENGINES_DIR/engines.env (`make engines-up`) with a fresh database,
topic and keyspace of its own, dropped at the end (--keep keeps them and prints the name;
--reuse NAME runs again on a kept one: the group is not created again, --preload writes that
many more). The admission gates and the backpressure limits are opened wide.

1. --preload N: N mailbox entries for other users (pre0000000...) of other conversations are
   written into the keyspace's mailbox table first, with the project's grouped writer
   (adapters/cassandra/mailbox.py: UNLOGGED batches of 100 rows, 200 in flight), one
   --preload-users-member message after another, printing progress and the rate.
2. The relay, --workers workers and (with --http) `fanout serve` start as subprocesses; the
   --members group is built through this process's own replica (bulk member adds).
3. Burst: --messages sends one after another (over HTTP to `fanout serve` with --http, else
   through this process's replica), then entries/s = mailbox entries of the delivery records /
   (the time this process's replica sees the views hold the last send - the time the first
   send was issued); also by the latest materialized_at, which the Cassandra views stamp once
   a unit of work's mailbox entries are written (since commit 9194b1f; before it, when the
   commit started: a unit holds up to 200k entries, two 100k-member messages, so that was
   seconds early). The CPU each process used meanwhile, and the
   client floor (encoding one message's batches without I/O, us per row; ADR-0039).
4. Latency: --latency-messages more, one at a time: accepted (the 201 received) -> this
   process seeing the views hold it, and -> materialized_at of that message (see 3).
5. The naive writer in the same run on the same Cassandra: for every member one prepared
   INSERT into the mailbox table plus one counter UPDATE (unread + 1) in a counter table,
   all through cassandra.concurrent.execute_concurrent (200 in flight), --naive-members
   members (default: the whole group, nothing extrapolated), and the ratio; then each of the two
   statements alone on --naive-parts-members members.
6. Peak memory of every process: relay, each worker, `fanout serve`, this process, the Kafka
   and Cassandra JVMs, PostgreSQL's processes (VmRSS sampled every 0.5 s, and VmHWM).

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time
import warnings
from collections.abc import Iterator
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
    proc_status,
    wait_workers,
    watch_fleet,
)
from durability import distributed as durability_in_force  # noqa: E402

from adapters.cassandra.connect import open_cluster  # noqa: E402
from adapters.cassandra.mailbox import IN_FLIGHT, CassandraMailbox, hour_of, partition_shard, ref  # noqa: E402
from fanout.bootstrap import bootstrap_distributed  # noqa: E402
from fanout.config import load_settings  # noqa: E402
from fanout.urls import CassandraSettings, cassandra_settings  # noqa: E402
from projections.ports import MessageRefs  # noqa: E402
from projections.sharding import shard_of  # noqa: E402

GROUP = "big"
SHARDS = 16  # Parameters().mailbox_shards


def grouped(users: list[str]) -> dict[int, list[str]]:
    by: dict[int, list[str]] = {}
    for u in users:
        by.setdefault(shard_of(u, SHARDS), []).append(u)
    return {s: sorted(b) for s, b in sorted(by.items())}


def preload(c: CassandraSettings, n: int, per_message: int) -> None:
    """n entries through CassandraMailbox.write, per_message members per message."""
    store = CassandraMailbox.from_settings(c)
    try:
        users = [f"pre{i:07d}" for i in range(min(n, per_message))]
        full = grouped(users)
        written, k, last = 0, 0, 0.0
        t0 = time.monotonic()
        while written < n:
            take = min(len(users), n - written)
            shards = full if take == len(users) else grouped(users[:take])
            k += 1
            written += store.write(TENANT, MessageRefs(f"pre{k}", k, 1, 0, {}, shards, at=time.time()))
            now = time.monotonic()
            if now - last >= 10 or written >= n:
                last = now
                print(f"  preload: {written:,} / {n:,} entries in {now - t0:.0f} s = "
                      f"{written / (now - t0):,.0f} entries/s", flush=True)  # fmt: skip
    finally:
        store.close()


def client_floor(c: CassandraSettings, members: list[str]) -> str:
    """What the worker's client costs per row before a byte is sent: the grouped writer's
    UNLOGGED batches of one message (CassandraMailbox.batches) encoded into protocol frames by
    the session's protocol handler (adapters/cassandra/batches.py, ADR-0039), without
    executing them (best of 3)."""
    from cassandra import ConsistencyLevel
    from cassandra.protocol import BatchMessage

    store = CassandraMailbox.from_settings(c)
    try:
        refs = MessageRefs(GROUP, 1, 1, 0, {}, grouped(members))
        encode = store.session.client_protocol_handler.encode_message
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for b in store.batches(TENANT, refs):
                message = BatchMessage(b.batch_type, b._statements_and_parameters, ConsistencyLevel.ONE)
                encode(message, 1, 5, None, False, None)
            best = min(best, time.perf_counter() - t)
    finally:
        store.close()
    return (f"client floor: one {len(members):,}-member message into encoded UNLOGGED batches (no I/O) takes "
            f"{best:.3f} s in one process = {best / len(members) * 1e6:.2f} us per row, "
            f"a ceiling of {len(members) / best:,.0f} rows/s per worker process before any I/O")  # fmt: skip


def naive_writer(c: CassandraSettings, members: list[str], messages: int, part: str) -> tuple[int, float]:
    """One INSERT + one counter UPDATE per member (part "both"; "insert" or "counter": that
    statement only), execute_concurrent; (entries, seconds)."""
    from cassandra.concurrent import execute_concurrent

    cluster, session = open_cluster(c.hosts, c.port, c.datacenter, c.consistency)
    try:
        ks = c.keyspace
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {ks}.naive_unread (tenant text, user_id text, conversation_id text, "
            "unread counter, PRIMARY KEY ((tenant, user_id), conversation_id))",
            timeout=120,
        )
        with warnings.catch_warnings():  # as adapters/cassandra/schema.py create_schema does
            warnings.simplefilter("ignore", DeprecationWarning)
            session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)
        insert = session.prepare(
            f"INSERT INTO {ks}.mailbox (tenant, shard, hour, user_id, pos, ref) VALUES (?, ?, ?, ?, ?, ?)"
        )
        hour = hour_of(time.time())
        bump = session.prepare(
            f"UPDATE {ks}.naive_unread SET unread = unread + 1 WHERE tenant=? AND user_id=? AND conversation_id=?"
        )

        def statements(tenant: str, users: list[str], pos: int) -> Iterator[tuple[Any, Any]]:
            for u in users:
                if part != "counter":
                    entry = ref(struct.pack(">q", pos), 0, GROUP.encode())  # conversation seq = pos here
                    yield insert, (tenant, partition_shard(u.encode()), hour, u, pos, entry)
                if part != "insert":
                    yield bump, (tenant, u, GROUP)

        execute_concurrent(session, statements("naive-warm", members[:2000], 1), concurrency=IN_FLIGHT,
                           raise_on_first_error=True)  # fmt: skip
        t = time.monotonic()
        for m in range(messages):
            execute_concurrent(session, statements(f"naive-{part}", members, 10**12 + m), concurrency=IN_FLIGHT,
                               raise_on_first_error=True)  # fmt: skip
        return len(members) * messages, time.monotonic() - t
    finally:
        cluster.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--messages", type=int, default=20, help="the burst (default 20)")
    ap.add_argument("--latency-messages", type=int, default=3, help="sent one at a time after the burst")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--http", action="store_true", help="send through `fanout serve` over HTTP")
    ap.add_argument("--preload", type=int, default=0, metavar="N", help="mailbox entries written first")
    ap.add_argument("--preload-users", type=int, default=100_000, help="members per preload message")
    ap.add_argument("--naive-members", type=int, help="members the naive writer writes (default --members)")
    ap.add_argument("--naive-messages", type=int, default=1)
    ap.add_argument("--no-naive", action="store_true", help="leave the naive writer out (bench/headline.py)")
    ap.add_argument("--naive-parts-members", type=int, default=20_000, help="members of the INSERT-only and "
                    "counter-only runs that show where the naive writer's time goes")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="keep the database, topic and keyspace")
    ap.add_argument("--reuse", metavar="NAME", help="run on a namespace kept by --keep")
    args = ap.parse_args()

    exit_on_sigterm()
    ns = Namespace(args.partitions, name=args.reuse)
    if not args.reuse:
        ns.create()
    settings = OPEN_GATES | {"FANOUT_MAX_GROUP_MEMBERS": str(max(args.members, 100_000))}
    fleet = Fleet(ns.urls, settings)
    watch = MemoryWatch()
    watch_fleet(watch, fleet)  # the engines now; the processes once started
    watch.start()
    c = cassandra_settings(ns.urls["FANOUT_VIEWS"])
    rt = None
    try:
        rt = bootstrap_distributed(load_settings({**ns.urls, **settings})).start()
        print(f"namespace {ns.name}{' (reused)' if args.reuse else ''}: {ns.urls}", flush=True)
        if args.preload:
            preload(c, args.preload, args.preload_users)
        fleet.start_pipeline(args.workers)
        http: Http | None = fleet.start_serve() if args.http else None
        watch_fleet(watch, fleet, "this process (replica)" if http is None else "this process (observer replica)")
        up = wait_workers(rt, args.workers)
        print(f"relay + {args.workers} worker(s){' + fanout serve' if http else ''} up in {up:.1f} s "
              f"(logs {fleet.logs})", flush=True)  # fmt: skip
        print(durability_in_force(ns.urls), flush=True)

        members = [f"u{i:06d}" for i in range(args.members)]
        head = rt.views.head(TENANT, GROUP)
        if head is None:
            t0 = time.monotonic()
            rt.app.create_conversation(TENANT, GROUP, GROUP, members[:10_000])
            for i in range(10_000, len(members), 10_000):
                rt.app.add_members(TENANT, GROUP, members[i : i + 10_000])
            rt.wait_until(rt.log_position(), 1800)
            print(f"group of {args.members:,} members created and projected in {time.monotonic() - t0:.1f} s",
                  flush=True)  # fmt: skip
        else:
            print(f"group exists: {head['member_count']:,} members, latest seq {head['latest_conversation_seq']}")

        def send(n: int, text: str) -> dict[str, Any]:
            sender = members[n % len(members)]
            if http is None:
                return rt.app.send_message(TENANT, GROUP, sender=sender, text=text)
            status, body = http.call("POST", f"/v1/conversations/{GROUP}/messages", {"sender": sender, "text": text})
            if status != 201:
                raise RuntimeError(f"send refused: {status} {body}")
            return dict(body)

        via = "HTTP (fanout serve)" if http else "this process's replica"
        cpu0 = watch.cpu()
        t0 = time.time()
        sent = [send(n, f"burst {n}") for n in range(args.messages)]
        t_sent = time.time()
        rt.wait_until(sent[-1]["position"], 3600)
        t_views = time.time()
        cpu1 = watch.cpu()
        records = [rt.queries.delivery(TENANT, GROUP, s["conversation_seq"]) for s in sent]
        last = max(float(r["materialized_at"]) for r in records)
        entries = sum(int(r["mailbox_entries"]) for r in records)
        rate = entries / (t_views - t0)
        print(f"burst: {args.messages} sends accepted via {via} in {t_sent - t0:.2f} s; this process saw the views "
              f"hold all {entries:,} mailbox entries {t_views - t0:.2f} s after the first send = {rate:,.0f} entries/s; "
              f"latest materialized_at {last - t0:.2f} s after it = {entries / (last - t0):,.0f} entries/s "
              "(materialized_at: stamped once a unit of work's mailbox entries are written)",
              flush=True)  # fmt: skip
        print("  " + watch.cpu_report(cpu0, cpu1, t_views - t0), flush=True)
        print("  " + client_floor(c, members), flush=True)

        to_mat, to_views = [], []
        for n in range(args.latency_messages):
            s = send(n + args.messages, f"latency {n}")
            accepted = time.time()
            rt.wait_until(s["position"], 600)
            to_views.append(time.time() - accepted)
            record = rt.queries.delivery(TENANT, GROUP, s["conversation_seq"])
            to_mat.append(float(record["materialized_at"]) - accepted)
            print(f"  latency message {n + 1}: accepted -> materialized_at {to_mat[-1]:.2f} s "
                  f"(-> views hold it {to_views[-1]:.2f} s; {record['mailbox_entries']:,} entries)", flush=True)  # fmt: skip
        if to_mat:
            print(f"latency (one {args.members:,}-member message at a time): accepted -> views hold it p50 "
                  f"{statistics.median(to_views):.2f} s, max {max(to_views):.2f} s; accepted -> materialized_at p50 "
                  f"{statistics.median(to_mat):.2f} s, max {max(to_mat):.2f} s (stamped after the mailbox write)",
                  flush=True)  # fmt: skip

        mine = proc_status(os.getpid())
        print(f"this process before the naive writer: VmRSS {mine.get('VmRSS', 0) / 1024:,.0f} MiB, "
              f"VmHWM {mine.get('VmHWM', 0) / 1024:,.0f} MiB", flush=True)  # fmt: skip
        if not args.no_naive:
            naive_members = members[: args.naive_members or len(members)]
            n, seconds = naive_writer(c, naive_members, args.naive_messages, "both")
            naive = n / seconds
            print(f"naive writer (per member: INSERT + counter UPDATE, execute_concurrent {IN_FLIGHT} in flight): "
                  f"{n:,} entries in {seconds:.2f} s = {naive:,.0f} entries/s "
                  f"({len(naive_members):,} members x {args.naive_messages} message(s), measured, not extrapolated)",
                  flush=True)  # fmt: skip
            print(f"ratio: end to end {rate:,.0f} / naive {naive:,.0f} = {rate / naive:.1f}x", flush=True)
            few = members[: min(len(members), args.naive_parts_members)]
            for part in ("insert", "counter"):
                n, seconds = naive_writer(c, few, 1, part)
                print(f"  naive writer's parts apart, {len(few):,} members: {part} only {n / seconds:,.0f} "
                      "statements/s", flush=True)  # fmt: skip
        print(watch.report(), flush=True)
    finally:
        watch.stop.set()
        fleet.stop()
        if rt is not None:
            rt.close()
        if args.keep:
            print(f"kept: --reuse {ns.name}", flush=True)
        else:
            for problem in ns.drop():
                print(f"not dropped: {problem}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
