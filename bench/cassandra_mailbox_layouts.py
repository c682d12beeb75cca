"""Cassandra's CPU a mailbox entry, by the mailbox table's partition key, on the running node:

* `user` (today's table, ADR-0014): partition (tenant, user_id), clustering pos. A message to N
  members is N partitions, so N mutations inside Cassandra, however the rows are batched;
* `shard`: partition (tenant, shard), clustering (user_id, pos), the shard a crc32 of the user
  (projections/sharding.py, the ADR's MailboxShard) modulo --shards. A message to N members is
  at most --shards mutations of N / shards rows each, one single-partition UNLOGGED batch each.

Same rows, same values, the same durable commit log, the same client (values serialized before
the clock starts, as the worker's `CassandraMailbox.rows` does; --in-flight batches in the air),
one fresh keyspace per layout, dropped afterwards; the layouts alternate --rounds times. Printed:
entries/s as the client sees them and Cassandra's CPU an entry (its process, from /proc; every
other process quiet). An experiment for the data model (docs/PERFORMANCE.md section 19): the
project's table is `shard` with the hour in its partition key (ADR-0038) and the `blob` row (ADR-0040).

    .venv/bin/python bench/cassandra_mailbox_layouts.py                      # 100k members, 3 messages, shards 256 and 1024
    .venv/bin/python bench/cassandra_mailbox_layouts.py --members 20 --messages 5000 --shards 16,256   # small groups
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

from cassandra.cluster import Cluster, Session
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_common import cpu_seconds, engine_pid, until_idle  # noqa: E402

from adapters.cassandra.batches import routing_key  # noqa: E402

_Q, _I = struct.Struct(">q"), struct.Struct(">i")


def cassandra_pid() -> int:
    pid = engine_pid("cassandra")
    if pid is None:
        raise SystemExit("no Cassandra of the engines here: start them first (make engines-up)")
    return pid


def cassandra_cpu() -> float:
    return cpu_seconds(cassandra_pid())


def table(session: Session, ks: str, layout: str, row: str = "cells", options: str = "") -> str:
    if layout == "user":
        session.execute(
            f"CREATE TABLE {ks}.mailbox (tenant text, user_id text, pos bigint, conversation_seq bigint, "
            "conversation_id text, flags int, PRIMARY KEY ((tenant, user_id), pos))"
        )
        return (
            f"INSERT INTO {ks}.mailbox (tenant, user_id, pos, conversation_seq, conversation_id, flags) "
            "VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
        )
    if row == "blob":  # the entry's seq, conversation and flags in one cell
        session.execute(
            f"CREATE TABLE {ks}.mailbox (tenant text, shard int, user_id text, pos bigint, ref blob, "
            "PRIMARY KEY ((tenant, shard), user_id, pos))" + (f" WITH {options}" if options else "")
        )
        return f"INSERT INTO {ks}.mailbox (tenant, shard, user_id, pos, ref) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?"
    clustering = ", conversation_seq, conversation_id, flags" if row == "key" else ""
    session.execute(
        f"CREATE TABLE {ks}.mailbox (tenant text, shard int, user_id text, pos bigint, conversation_seq bigint, "
        f"conversation_id text, flags int, PRIMARY KEY ((tenant, shard), user_id, pos{clustering}))"
        + (f" WITH {options}" if options else "")
    )
    return (
        f"INSERT INTO {ks}.mailbox (tenant, shard, user_id, pos, conversation_seq, conversation_id, flags) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
    )


def batches(
    layout: str, shards: int, query_id: bytes, ks: str, groups: list[list[str]], messages: int, size: int, row: str
) -> Iterator[tuple[BatchStatement, None]]:
    """The batches of every message, in message order: `user` packs consecutive members into
    batches of `size` rows (as CassandraMailbox does); `shard` gives each shard's rows of a
    message batches of their own (one partition each)."""
    t, cid, flags = b"t", b"g", _I.pack(0)
    for m in range(messages):
        members = groups[m % len(groups)]
        pos, seq, ts = _Q.pack(1000 + m), _Q.pack(m + 1), _Q.pack(10**15 + m)
        if layout == "user":
            for i in range(0, len(members), size):
                b = BatchStatement(batch_type=BatchType.UNLOGGED)
                first = members[i].encode()
                b.routing_key, b.keyspace = routing_key((t, first)), ks
                for u in members[i : i + size]:
                    b._add_statement_and_params(True, query_id, [t, u.encode(), pos, seq, cid, flags, ts])
                yield b, None
            continue
        by: dict[int, list[str]] = {}
        for u in members:
            by.setdefault(zlib.crc32(u.encode()) % shards, []).append(u)
        for shard, users in by.items():
            cell = _I.pack(shard)
            for i in range(0, len(users), size):
                b = BatchStatement(batch_type=BatchType.UNLOGGED)
                b.routing_key, b.keyspace = routing_key((t, cell)), ks
                for u in users[i : i + size]:
                    if row == "blob":
                        values = [t, cell, u.encode(), pos, seq + cid + flags, ts]
                    else:
                        values = [t, cell, u.encode(), pos, seq, cid, flags, ts]
                    b._add_statement_and_params(True, query_id, values)
                yield b, None


def measure(
    session: Session, layout: str, shards: int, a: argparse.Namespace, row: str = "cells", options: str = ""
) -> tuple[float, float, int]:
    ks = f"bench_layout_{uuid.uuid4().hex[:8]}"
    session.execute(f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    try:
        insert = session.prepare(table(session, ks, layout, row, options))
        users = [f"user{i:07d}" for i in range(a.members * a.groups)]
        groups = [users[g * a.members : (g + 1) * a.members] for g in range(a.groups)]
        work = list(batches(layout, shards, insert.query_id, ks, groups, a.messages, a.batch_rows, row))
        rows = a.members * a.messages
        cpu0, t0 = cassandra_cpu(), time.perf_counter()
        execute_concurrent(session, work, concurrency=a.in_flight, raise_on_first_error=True)
        took, cpu = time.perf_counter() - t0, cassandra_cpu() - cpu0
        if a.settle:  # the flushes and compactions the writes set off, until Cassandra idles
            cpu = until_idle(cassandra_pid(), 0.05) - cpu0
        return rows / took, cpu / rows * 1e6, len(work)
    finally:
        session.execute(f"DROP KEYSPACE {ks}", timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=int(os.environ.get("FANOUT_ENGINES_CASSANDRA_PORT", "19042")))
    ap.add_argument("--members", type=int, default=100_000, help="members of each group (100000)")
    ap.add_argument("--groups", type=int, default=1, help="groups, disjoint members, messages round-robin (1)")
    ap.add_argument("--messages", type=int, default=3, help="messages written (3)")
    ap.add_argument("--shards", default="256,1024", help="shard counts of the `shard` layout (256,1024)")
    ap.add_argument("--batch-rows", type=int, default=100, help="rows an UNLOGGED batch at most (100)")
    ap.add_argument("--in-flight", type=int, default=200, help="batches in the air (200)")
    ap.add_argument("--rounds", type=int, default=2, help="times each layout runs, alternating (2)")
    ap.add_argument(
        "--rows",
        default="cells",
        help="the `shard` layout's row shapes, comma-separated: cells (seq, conversation, flags: three "
        "cells, ADR-0038's), blob (the three in one cell, the project's: ADR-0040), key (the three in the clustering key, no cell)",
    )
    ap.add_argument("--no-user", action="store_true", help="leave out the `user` layout")
    ap.add_argument(
        "--settle",
        action="store_true",
        help="count Cassandra's CPU until it idles after the writes (the flushes and compactions they set off)",
    )
    ap.add_argument(
        "--table-options",
        action="append",
        help="the `shard` tables' WITH clause, e.g. \"compaction = {'class': 'UnifiedCompactionStrategy'}\"; "
        "repeat it to alternate several (an empty one is Cassandra's defaults)",
    )
    a = ap.parse_args()
    cluster = Cluster(["127.0.0.1"], port=a.port, protocol_version=5)
    session = cluster.connect()
    try:
        shapes = a.rows.split(",")
        layouts = [] if a.no_user else [("user", 0, "cells", "")]
        options = a.table_options or [""]
        layouts += [("shard", int(s), r, o) for s in a.shards.split(",") for r in shapes for o in options]
        measure(session, "user", 0, argparse.Namespace(**{**vars(a), "messages": 1}))  # warm-up, not printed
        print(
            f"{a.messages} messages to groups of {a.members} ({a.members * a.messages:,} entries), "
            f"batches of <= {a.batch_rows} rows, {a.in_flight} in flight"
        )
        for r in range(a.rounds):
            for layout, shards, row, option in layouts:
                rate, cpu, n = measure(session, layout, shards, a, row, option)
                name = "user (tenant, user_id)" if layout == "user" else f"shard (tenant, shard of {shards}) {row}"
                if len(options) > 1:
                    name += f" [{option or 'defaults'}]"
                print(
                    f"  round {r + 1}  {name:32} {rate:9,.0f} entries/s  Cassandra {cpu:6.1f} us of CPU an entry"
                    f"  ({n:,} batches)",
                    flush=True,
                )
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
