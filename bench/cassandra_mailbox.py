"""Mailbox entries/s of one message to a 100k-member group on the running Cassandra:
CassandraMailbox (grouped UNLOGGED batches, many in flight) against the naive way (one
INSERT per member, awaited one after another), in the same run, in a fresh keyspace
dropped afterwards. The naive way is measured on 5k members and extrapolated.

    .venv/bin/python bench/cassandra_mailbox.py [--url cassandra://127.0.0.1:19042/x] [--members 100000] [--reactor asyncio|libev]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.cassandra.mailbox import BATCH_ROWS, IN_FLIGHT, CassandraMailbox, partition_shard, ref  # noqa: E402
from fanout.urls import cassandra_settings  # noqa: E402
from projections.ports import MessageRefs  # noqa: E402
from projections.sharding import shard_of  # noqa: E402

SHARDS = 16


def refs(pos: int, users: list[str]) -> MessageRefs:
    by: dict[int, list[str]] = {}
    for u in users:
        by.setdefault(shard_of(u, SHARDS), []).append(u)
    return MessageRefs("big", pos, pos, 0, {users[0]: 1}, {s: sorted(b) for s, b in by.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="cassandra://127.0.0.1:19042/bench")
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--naive-members", type=int, default=5_000)
    ap.add_argument("--reactor", default="libev", choices=["asyncio", "libev"])
    a = ap.parse_args()
    c = cassandra_settings(a.url)
    keyspace = f"bench_{uuid.uuid4().hex[:10]}"
    store = CassandraMailbox.connect(
        c.hosts,
        c.port,
        keyspace,
        replication=c.replication,
        consistency=c.consistency,
        datacenter=c.datacenter,
        reactor=a.reactor,
    )
    try:
        users = [f"user{i:07d}" for i in range(a.members)]
        store.write("warm", refs(1, users[:2000]))  # connections, prepared statements, JIT
        runs = []
        for pos in (2, 3):
            t = time.perf_counter()
            n = store.write("t", refs(pos, users))
            runs.append(n / (time.perf_counter() - t))
        grouped = max(runs)
        print(
            f"grouped: {a.members} entries, UNLOGGED batches of {BATCH_ROWS}, {IN_FLIGHT} in flight: "
            f"{', '.join(f'{r:,.0f}' for r in runs)} entries/s (best {grouped:,.0f}; "
            f"{a.members / grouped:.2f} s per 100k-member message)"
        )
        naive = store.session.prepare(
            f"INSERT INTO {keyspace}.mailbox (tenant, shard, hour, user_id, pos, ref) VALUES (?, ?, ?, ?, ?, ?)"
        )
        few = users[: a.naive_members]
        t = time.perf_counter()
        for u in few:
            store.session.execute(
                naive, ("t", partition_shard(u.encode()), 0, u, 4, ref(struct.pack(">q", 4), 0, b"big"))
            )
        per_row = len(few) / (time.perf_counter() - t)
        print(
            f"naive: one INSERT per member, one round trip each: {per_row:,.0f} entries/s measured on "
            f"{len(few)} members; extrapolated to {a.members}: {a.members / per_row:.1f} s per message"
        )
        print(f"grouped / naive: {grouped / per_row:.1f}x (reactor {a.reactor})")
        assert store.read("t", users[0], 0, 3, 5)[0][4] == 1
    finally:
        store.close()
        from cassandra.cluster import Cluster

        cluster = Cluster(list(c.hosts), port=c.port, protocol_version=5)  # a fresh one: the store's may be broken
        try:
            cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        finally:
            cluster.shutdown()


if __name__ == "__main__":
    main()
