"""Fan-out through the distributed runtime on the real engines, end to end:
send accepted by an API replica (PostgreSQL) -> `fanout relay` (Kafka transaction) ->
`fanout worker` (Faust, Cassandra views and mailbox) -> materialized_at.

    .venv/bin/python bench/distributed_fanout.py                       # 100k members, 5 messages
    .venv/bin/python bench/distributed_fanout.py --members 20000 --workers 2

Uses the engines in $FANOUT_ENGINES_DIR/engines.env (`make engines-up`) with a fresh database,
topic and keyspace of its own (dropped at the end). Messages are sent one at a time: for each,
the time from the send being accepted to the views' low watermark holding it, and to its
delivery record's materialized_at; then mailbox entries/s over all of them. The same run also
writes one message's references the naive way (one INSERT per member, on --naive-members
members, extrapolated: said so in the output). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fanout.bootstrap import bootstrap_distributed  # noqa: E402
from fanout.config import load_settings  # noqa: E402
from fanout.urls import cassandra_settings  # noqa: E402


def env_file() -> dict[str, str]:
    path = Path(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines")) / "engines.env"
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def with_path(url: str, path: str, query: str | None = None) -> str:
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, "/" + path, u.query if query is None else query, ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--messages", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--naive-members", type=int, default=3_000)
    args = ap.parse_args()

    import psycopg
    from cassandra.cluster import Cluster

    engines = env_file()
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = with_path(engines["FANOUT_EVENT_STORE"], "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    urls = {
        "FANOUT_EVENT_STORE": with_path(engines["FANOUT_EVENT_STORE"], name),
        "FANOUT_LOG": with_path(engines["FANOUT_LOG"], "", f"topic={name}&partitions={args.partitions}"),
        "FANOUT_VIEWS": with_path(engines["FANOUT_VIEWS"], name),
    }
    settings = {
        "FANOUT_MAX_GROUP_MEMBERS": str(max(args.members, 100_000)),
        "FANOUT_TENANT_FANOUT_QUOTA_CAPACITY": "1e12",
        "FANOUT_TENANT_FANOUT_QUOTA_REFILL": "1e12",
        "FANOUT_PER_SENDER_IN_CONVERSATION_RATE": "1000/s",
        "FANOUT_MAX_PROJECTION_LAG_ENTRIES": "100000000",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")} | urls | settings
    env["PYTHONPATH"] = str(ROOT)
    logs = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    rt = bootstrap_distributed(load_settings({**urls, **settings})).start()
    try:
        for kind in ["relay"] + ["worker"] * args.workers:
            log = open(logs / f"{kind}-{len(procs)}.log", "wb")  # noqa: SIM115
            procs.append(subprocess.Popen([sys.executable, "-m", f"cli.{kind}"], env=env, stdout=log, stderr=log, cwd=ROOT))
        t0 = time.monotonic()
        while rt.engines.workers() < args.workers:
            time.sleep(0.2)
        print(f"engines: {urls}\nrelay + {args.workers} worker(s) up in {time.monotonic() - t0:.1f} s "
              f"(logs {logs})", flush=True)  # fmt: skip

        members = [f"u{i:06d}" for i in range(args.members)]
        t0 = time.monotonic()
        rt.app.create_conversation("bench", "big", "big", members[: min(len(members), 10_000)])
        for i in range(10_000, len(members), 10_000):
            rt.app.add_members("bench", "big", members[i : i + 10_000])
        rt.wait_projected(600)
        print(f"group of {args.members} members created and projected in {time.monotonic() - t0:.1f} s", flush=True)

        to_watermark, to_materialized = [], []
        t_all = time.monotonic()
        for n in range(args.messages):
            t = time.monotonic()
            sent = rt.app.send_message("bench", "big", sender=members[n % len(members)], text=f"m{n}")
            accepted = time.time()
            rt.wait_until(sent["position"], 600)
            to_watermark.append(time.monotonic() - t)
            record = rt.queries.delivery("bench", "big", sent["conversation_seq"])
            to_materialized.append(float(record["materialized_at"]) - accepted)
            print(f"  message {n + 1}: accepted -> views hold it {to_watermark[-1]:.2f} s "
                  f"(materialized_at - accepted {to_materialized[-1]:.2f} s)", flush=True)  # fmt: skip
        total = time.monotonic() - t_all
        entries = args.members * args.messages
        print(f"fan-out: {entries} mailbox entries in {total:.1f} s = {entries / total:,.0f} entries/s "
              f"(one message at a time; p50 accepted->views {statistics.median(to_watermark):.2f} s, "
              f"max {max(to_watermark):.2f} s)", flush=True)  # fmt: skip

        # The naive writer in the same run: one INSERT per member into the same table layout.
        c = cassandra_settings(urls["FANOUT_VIEWS"])
        cluster = Cluster(list(c.hosts), port=c.port, protocol_version=5)
        session = cluster.connect(c.keyspace)
        insert = session.prepare(
            "INSERT INTO mailbox (tenant, user_id, pos, conversation_seq, conversation_id, flags) VALUES (?, ?, ?, ?, ?, ?)"
        )
        t = time.monotonic()
        for i, u in enumerate(members[: args.naive_members]):
            session.execute(insert, ("naive", u, 10**9 + i, 1, "big", 0))
        naive = args.naive_members / (time.monotonic() - t)
        cluster.shutdown()
        print(f"naive (one INSERT per member, {args.naive_members} members, extrapolated): {naive:,.0f} entries/s "
              f"-> {args.members / naive:.1f} s per {args.members}-member message; "
              f"batched end to end is {entries / total / naive:.1f}x", flush=True)  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        rt.close()
        c = cassandra_settings(urls["FANOUT_VIEWS"])
        cluster = Cluster(list(c.hosts), port=c.port, protocol_version=5)
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {c.keyspace}", timeout=120)
        cluster.shutdown()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
