"""Cassandra's CPU to read a login's heads, by the layout of the heads, on the running node:

* `partition`: a partition a head, `((tenant, conversation_id))` (the `heads` table,
  ADR-0014), read by `IN` on the partition key, --per-read keys a request;
* `shards=S`: the heads of a tenant in S partitions, `((tenant, shard), conversation_id)`, the
  shard a crc32 of the conversation id modulo S (the `session_heads` copy of ADR-0042: S=64),
  read by `IN` on the clustering key, the ids of one shard --per-read to a request.

One fresh keyspace holds both tables with --conversations heads of one tenant (the session
columns of a head: write policy, latest seq, broadcasts, last activity, preview); a user's
--heads of them, picked at random, are read --rounds times, the layouts alternating, every
request of a read in flight at once (200). Printed: the wall time of a read and Cassandra's
CPU for it (its process, from /proc, counted until it idles 0.3 s after the read; every other
process quiet). The keyspace is dropped at the end. Measured in docs/PERFORMANCE.md section 22.

    .venv/bin/python bench/cassandra_heads_layouts.py                           # 50,000 heads, a user's 5,000, shards 16,64,256
    .venv/bin/python bench/cassandra_heads_layouts.py --shards 64 --per-read 50,100,400
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import tuple_factory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cassandra_mailbox_layouts import ENGINES_DIR, cassandra_cpu  # noqa: E402

COLUMNS = (
    "write_policy text, latest_conversation_seq bigint, broadcasts bigint, last_activity_id text, "
    "last_activity_at double, preview text"
)
NAMES = "write_policy, latest_conversation_seq, broadcasts, last_activity_id, last_activity_at, preview"
VALUES = ("always", 7, 0, "01HZX0000000000000000000", 1.7e9, "hello from someone")
IN_FLIGHT = 200


def views_host() -> tuple[str, int]:
    for line in (ENGINES_DIR / "engines.env").read_text().splitlines():
        if line.startswith("FANOUT_VIEWS="):
            host, port = line.split("//", 1)[1].split("/", 1)[0].split(":")
            return host, int(port)
    raise SystemExit(f"no FANOUT_VIEWS in {ENGINES_DIR / 'engines.env'}: run `make engines-up` first")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=50_000, help="heads of the tenant (default 50,000)")
    ap.add_argument("--heads", type=int, default=5000, help="the user's heads read by a login (default 5,000)")
    ap.add_argument("--shards", default="16,64,256", help="shard counts to compare (default 16,64,256)")
    ap.add_argument("--per-read", default="100", help="ids a request, comma separated to compare (default 100)")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    shard_counts = [int(s) for s in args.shards.split(",")]
    per_reads = [int(s) for s in args.per_read.split(",")]

    host, port = views_host()
    profile = ExecutionProfile(row_factory=tuple_factory, request_timeout=120)
    cluster = Cluster([host], port=port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    s = cluster.connect()
    ks = f"bench_heads_{uuid.uuid4().hex[:10]}"
    s.execute(f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    try:
        ids = [f"conv-{i:08d}" for i in range(args.conversations)]
        s.execute(
            f"CREATE TABLE {ks}.heads (tenant text, conversation_id text, {COLUMNS}, PRIMARY KEY ((tenant, conversation_id)))"
        )
        insert = s.prepare(
            f"INSERT INTO {ks}.heads (tenant, conversation_id, {NAMES}) VALUES ('t', ?, ?, ?, ?, ?, ?, ?)"
        )
        execute_concurrent_with_args(s, insert, [(c, *VALUES) for c in ids], concurrency=IN_FLIGHT)
        for n in shard_counts:
            s.execute(
                f"CREATE TABLE {ks}.shards_{n} (tenant text, shard int, conversation_id text, {COLUMNS}, "
                "PRIMARY KEY ((tenant, shard), conversation_id))"
            )
            insert = s.prepare(
                f"INSERT INTO {ks}.shards_{n} (tenant, shard, conversation_id, {NAMES}) VALUES ('t', ?, ?, ?, ?, ?, ?, ?, ?)"
            )
            rows = [(zlib.crc32(c.encode()) % n, c, *VALUES) for c in ids]
            execute_concurrent_with_args(s, insert, rows, concurrency=IN_FLIGHT)
        print(f"keyspace {ks}: {args.conversations:,} heads in each layout", flush=True)
        mine = random.Random(1).sample(ids, args.heads)

        def read(statement: object, requests: list[tuple[object, ...]]) -> int:
            n = 0
            for ok, result in execute_concurrent_with_args(s, statement, requests, concurrency=IN_FLIGHT):
                if not ok:
                    raise result
                n += len(list(result))
            return n

        ways: list[tuple[str, Callable[[], int]]] = []
        by_key = s.prepare(f"SELECT conversation_id, {NAMES} FROM {ks}.heads WHERE tenant='t' AND conversation_id IN ?")
        for per in per_reads:
            chunks = [(mine[i : i + per],) for i in range(0, len(mine), per)]
            ways.append((f"a partition a head, IN of {per}", lambda st=by_key, c=chunks: read(st, c)))
        for n in shard_counts:
            by_shard: dict[int, list[str]] = {}
            for c in mine:
                by_shard.setdefault(zlib.crc32(c.encode()) % n, []).append(c)
            stmt = s.prepare(
                f"SELECT conversation_id, {NAMES} FROM {ks}.shards_{n} WHERE tenant='t' AND shard=? AND conversation_id IN ?"
            )
            for per in per_reads:
                reqs = [(sh, part[i : i + per]) for sh, part in by_shard.items() for i in range(0, len(part), per)]
                ways.append((f"{n} shards, IN of {per}", lambda st=stmt, r=reqs: read(st, r)))
        for _, f in ways:  # warm-up
            f()
        walls: dict[str, list[float]] = {name: [] for name, _ in ways}
        cpus: dict[str, list[float]] = {name: [] for name, _ in ways}
        for r in range(args.rounds):
            for name, f in ways if r % 2 == 0 else list(reversed(ways)):
                c0, t0 = cassandra_cpu(), time.perf_counter()
                got = f()
                t1 = time.perf_counter()
                time.sleep(0.3)
                cpus[name].append(cassandra_cpu() - c0)
                walls[name].append(t1 - t0)
                if got != args.heads:
                    raise SystemExit(f"{name}: read {got} heads, expected {args.heads}")
        print(f"a login's {args.heads:,} heads of {args.conversations:,}, {args.rounds} reads each, alternating:")
        for name, _ in ways:
            print(
                f"  {name:32s} wall p50 {1000 * statistics.median(walls[name]):7.1f} ms   "
                f"Cassandra CPU p50 {1000 * statistics.median(cpus[name]):7.1f} ms "
                f"({1e6 * statistics.median(cpus[name]) / args.heads:5.1f} us a head)"
            )
    finally:
        s.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=300)
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
