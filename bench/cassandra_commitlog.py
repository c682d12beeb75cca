"""What a durable Cassandra commit log costs (ADR-0021): the project's Cassandra restarted in
each `commitlog_sync` mode, then the same writes timed in each.

    .venv/bin/python bench/cassandra_commitlog.py                       # periodic, batch, group
    .venv/bin/python bench/cassandra_commitlog.py --modes periodic,batch --units 100
    .venv/bin/python bench/cassandra_commitlog.py --modes batch --concurrent-writes 16,64,128 --rows 60000

* sequential: one INSERT at a time (a request waits for its acknowledgement): p50 / p99;
* units: what a worker's unit of work does, 7 rounds one after the other (mailbox, messages,
  delivery, states, admin, heads, tracking), each round 20 INSERTs in flight at once: units/s
  and ms per unit;
* fan-out: --rows mailbox rows (20,000) as UNLOGGED batches of 100, 200 in flight: rows/s.

--concurrent-writes N[,N...]: Cassandra's `concurrent_writes` (its mutation threads; with the
`batch` commit log each one waits for the fsync of its write, ADR-0033), one restart each.

Restarts the engines' Cassandra (infra/engines/cassandra-{down,up}.sh) for each mode and
leaves it in the project's default (batch) at the end, so run it on a quiet machine, not beside
the test suite. Prints numbers and the CPU the Cassandra process used; asserts nothing."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import uuid
from pathlib import Path

from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "infra" / "engines"
ENGINES_DIR = Path(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines"))
PORT = int(os.environ.get("FANOUT_ENGINES_CASSANDRA_PORT", "19042"))


def restart(mode: str, concurrent_writes: int | None = None) -> float:
    env = {**os.environ, "FANOUT_ENGINES_CASSANDRA_COMMITLOG": mode}
    if concurrent_writes is not None:
        env["FANOUT_ENGINES_CASSANDRA_CONCURRENT_WRITES"] = str(concurrent_writes)
    subprocess.run(["bash", str(SCRIPTS / "cassandra-down.sh")], check=True, stdout=subprocess.DEVNULL, env=env)
    t0 = time.monotonic()
    subprocess.run(["bash", str(SCRIPTS / "cassandra-up.sh")], check=True, stdout=subprocess.DEVNULL, env=env)
    return time.monotonic() - t0


def cpu_seconds() -> float:
    pid = int((ENGINES_DIR / "cassandra" / "cassandra.pid").read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(units: int, rows: int = 20_000) -> dict[str, float]:
    cluster = Cluster(["127.0.0.1"], port=PORT, protocol_version=5)
    session = cluster.connect()
    ks = f"bench_commitlog_{uuid.uuid4().hex[:8]}"
    session.execute(f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    session.execute(f"CREATE TABLE {ks}.t (k text, c int, v text, PRIMARY KEY ((k), c))")
    insert = session.prepare(f"INSERT INTO {ks}.t (k, c, v) VALUES (?, ?, ?)")
    out: dict[str, float] = {}
    try:
        cpu0 = cpu_seconds()
        lat = []
        for i in range(500):
            t = time.perf_counter()
            session.execute(insert, (f"s{i % 50}", i, "x" * 60))
            lat.append(time.perf_counter() - t)
        lat.sort()
        out["sequential p50 ms"] = statistics.median(lat) * 1000
        out["sequential p99 ms"] = lat[int(len(lat) * 0.99)] * 1000
        t0 = time.perf_counter()
        for u in range(units):
            for r in range(7):
                execute_concurrent(
                    session, [(insert, (f"u{u}-{r}-{j}", j, "y" * 60)) for j in range(20)], concurrency=20
                )
        took = time.perf_counter() - t0
        out["units/s"] = units / took
        out["ms per unit"] = took / units * 1000
        batches = []
        for b in range(rows // 100):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for j in range(100):
                batch.add(insert, (f"m{b * 100 + j}", 1, "z" * 40))
            batches.append((batch, None))
        t0 = time.perf_counter()
        execute_concurrent(session, batches, concurrency=200)
        out["fan-out rows/s"] = rows // 100 * 100 / (time.perf_counter() - t0)
        out["cassandra cpu s"] = cpu_seconds() - cpu0
    finally:
        session.execute(f"DROP KEYSPACE {ks}", timeout=120)
        cluster.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="periodic,group,batch", help="commitlog_sync modes, in order")
    ap.add_argument("--units", type=int, default=100, help="units of work of 7 rounds to time")
    ap.add_argument("--rows", type=int, default=20_000, help="mailbox rows of the fan-out part")
    ap.add_argument(
        "--concurrent-writes",
        default="",
        help="Cassandra concurrent_writes values to restart with, e.g. 16,64 (default: the engines' own)",
    )
    args = ap.parse_args()
    writes = [int(w) for w in args.concurrent_writes.split(",") if w] or [None]
    results: dict[str, dict[str, float]] = {}
    try:
        for mode in args.modes.split(","):
            for w in writes:
                label = mode if w is None else f"{mode}, concurrent_writes {w}"
                up = restart(mode, w)
                print(f"{label}: Cassandra up in {up:.1f} s", flush=True)
                results[label] = measure(args.units, args.rows)
                print("  " + ", ".join(f"{k} {v:,.1f}" for k, v in results[label].items()), flush=True)
    finally:
        if args.modes.split(",")[-1] != "batch" or writes[-1] is not None:
            restart("batch")
    keys = list(next(iter(results.values())))
    print("\n| mode | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for mode, r in results.items():
        print(f"| {mode} | " + " | ".join(f"{r[k]:,.1f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
