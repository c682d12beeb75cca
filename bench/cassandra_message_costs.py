"""Where Cassandra's CPU for a small-group message goes, table by table, on the running node.

A worker's unit of small-group messages writes, for each message (the project's tables,
created by `adapters.cassandra.schema.create_schema` in a fresh keyspace):

* `mailbox`: a row for each of the --members members, in the partition (MailboxShard, hour)
  of the member (ADR-0038, ADR-0050), a unit's rows grouped by partition;
* the conversation's mutation: `messages`, `delivery`, `heads` and the sender's
  `conversation_states` row, one partition key (tenant, conversation);
* the sender's mutation: `user_states`, `session_states`, `mailbox_floors`, one partition key
  (tenant, user).

Here the same rows go in units of --unit messages, as the worker sends them: round A (the
mailbox and the senders' rows, UNLOGGED batches of up to --batch-rows rows, a partition's rows
of every table consecutive, so one mutation; every batch in flight), then round B (the
conversations' rows). Each variant writes some of those parts only (`all`, `no-mailbox`,
`sender-only`, ...); the difference in Cassandra's CPU (its process, from /proc, counted until
it idles after the writes, so flushes in) is what the parts left out cost. The `merged*`
variants write two layouts that are not the project's, one table less in each mutation (the
message's row with its delivery record; the user's state as one blob with the mailbox floor a
static cell), to price a table inside a mutation. The variants alternate --rounds times; the
node's mailbox shards are the project's (`partition_shard`, adapters/cassandra/mailbox.py).

Not the worker: values are bound by the driver (no packed batches) and nothing is folded;
this measures the node only. Assumes nothing else runs (the node's CPU is read whole), and a
node that has done some work since it started (the first runs after a start cost up to twice
as much: JIT). docs/PERFORMANCE.md section 33.

    .venv/bin/python bench/cassandra_message_costs.py
    .venv/bin/python bench/cassandra_message_costs.py --messages 10000 --rounds 3 --variants all,no-mailbox
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cassandra.cluster import Cluster, Session
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType, PreparedStatement

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_common import cpu_seconds, engine_pid, until_idle  # noqa: E402

from adapters.cassandra.mailbox import partition_shard  # noqa: E402
from adapters.cassandra.schema import ALL_TABLES, create_schema  # noqa: E402

PORT = int(os.environ.get("FANOUT_ENGINES_CASSANDRA_PORT", "19042"))
IDLE = 0.08  # CPU seconds in a second under which the node counts as idle (flushes done)
STATE = "read_conversation_seq, joined_seq, last_active, delivered_conversation_seq, skipping, gap_end, rebuilt_seq, mention_seqs, broadcast_base"
TABLE_SETS = {
    "mailbox": ("mailbox",),
    "conversation": ("messages", "delivery", "heads", "conversation_states"),
    "sender": ("user_states", "session_states", "mailbox_floors"),
    # not the project's layout: the message's row with its delivery record, and the user's
    # state as one blob with the floor a static cell (one table a partition key less each)
    "merged-conversation": ("messages_delivery", "heads", "conversation_states"),
    "merged-sender": ("user_state_blobs",),
}
VARIANTS = {
    "all": ("mailbox", "conversation", "sender"),
    "no-mailbox": ("conversation", "sender"),
    "no-conversation": ("mailbox", "sender"),
    "no-sender": ("mailbox", "conversation"),
    "mailbox-only": ("mailbox",),
    "conversation-only": ("conversation",),
    "messages-delivery": ("messages", "delivery"),
    "messages-only": ("messages",),
    "sender-only": ("sender",),
    "user_states-only": ("user_states",),
    "merged": ("mailbox", "merged-conversation", "merged-sender"),
    "merged-conversation-only": ("merged-conversation",),
    "merged-sender-only": ("merged-sender",),
}


def cassandra_pid() -> int:
    pid = engine_pid("cassandra")
    if pid is None:
        raise SystemExit("no Cassandra of the engines here: start them first (make engines-up)")
    return pid


class Statements:
    def __init__(self, session: Session, ks: str) -> None:
        p = session.prepare
        self.mailbox = p(f"INSERT INTO {ks}.mailbox (tenant, shard, hour, user_id, pos, ref) VALUES (?, ?, ?, ?, ?, ?)")
        self.messages = p(
            f"INSERT INTO {ks}.messages (tenant, conversation_id, conversation_seq, message_id, sender, text, "
            "mentions, mention_all, reply_to_seq, announcement, sent_at, pos) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.delivery = p(
            f"INSERT INTO {ks}.delivery (tenant, conversation_id, conversation_seq, message_id, write_policy, "
            "member_count, mailbox_entries, shards, body_bytes, pos, online_pushes, materialized_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.heads = p(
            f"INSERT INTO {ks}.heads (tenant, conversation_id, aggregate_id, title, latest_conversation_seq, "
            "last_activity_id, last_activity_at, preview, member_count, size_bucket, write_policy, broadcasts, "
            "created_at, position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.conversation_states = p(
            f"INSERT INTO {ks}.conversation_states (tenant, conversation_id, user_id, {STATE}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.user_states = p(
            f"INSERT INTO {ks}.user_states (tenant, user_id, conversation_id, {STATE}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.session_states = p(
            f"INSERT INTO {ks}.session_states (tenant, user_id, conversation_id, state) VALUES (?, ?, ?, ?)"
        )
        self.mailbox_floors = p(f"INSERT INTO {ks}.mailbox_floors (tenant, user_id, above) VALUES (?, ?, ?)")
        # two layouts that are not the project's: fewer tables a mutation (the variants `merged-*`)
        session.execute(
            f"CREATE TABLE {ks}.messages_delivery (tenant text, conversation_id text, conversation_seq bigint, "
            "message_id text, sender text, text text, mentions text, mention_all boolean, reply_to_seq bigint, "
            "announcement boolean, sent_at double, pos bigint, write_policy text, member_count bigint, "
            "mailbox_entries bigint, shards int, body_bytes bigint, delivery_pos bigint, online_pushes bigint, "
            "materialized_at double, PRIMARY KEY ((tenant, conversation_id), conversation_seq))"
        )
        session.execute(
            f"CREATE TABLE {ks}.user_state_blobs (tenant text, user_id text, conversation_id text, state blob, "
            "above bigint static, PRIMARY KEY ((tenant, user_id), conversation_id))"
        )
        self.messages_delivery = p(
            f"INSERT INTO {ks}.messages_delivery (tenant, conversation_id, conversation_seq, message_id, sender, text, "
            "mentions, mention_all, reply_to_seq, announcement, sent_at, pos, write_policy, member_count, "
            "mailbox_entries, shards, body_bytes, delivery_pos, online_pushes, materialized_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.user_state_blobs = p(
            f"INSERT INTO {ks}.user_state_blobs (tenant, user_id, conversation_id, state, above) VALUES (?, ?, ?, ?, ?)"
        )


Row = tuple[PreparedStatement, tuple[Any, ...], tuple[str, ...]]  # statement, values, partition key


def message_rows(st: Statements, n: int, members: int, users: int, groups: int) -> dict[str, list[Row]]:
    """Message n's rows by table, as the worker's writer would put them, each with its
    partition key."""
    tenant, hour = "t", 493_000
    conv = f"g{n % groups}"
    seq = n // groups + 1
    first = (n % groups) * members
    group = [f"u{(first + i) % users}" for i in range(members)]
    sender = group[n % members]
    ref = seq.to_bytes(4, "big") + b"\x00" * 4  # an entry in one cell (ADR-0040): about this size
    state = (seq, 1, 1.7e9 + n, seq, 0, None, None, "", 0)
    text = f"message {n} to the small group {conv}, about this long"
    message = (f"m{n}", sender, text, "", False, None, False, 1.7e9, n)
    delivery = ("always", members, members, 4, 60, n, 0, 1.7e9)
    head = (f"a{conv}", conv, seq, f"m{n}", 1.7e9, text[:40], members, "s", "always", 0, 1.6e9, n)
    c, u = ("c", tenant, conv), ("u", tenant, sender)
    return {
        "mailbox": [
            (st.mailbox, (tenant, s, hour, m, n, ref), ("m", str(s), str(hour)))
            for m in group
            for s in (partition_shard(m.encode()),)
        ],
        "messages": [(st.messages, (tenant, conv, seq, *message), c)],
        "delivery": [(st.delivery, (tenant, conv, seq, f"m{n}", *delivery), c)],
        "messages_delivery": [(st.messages_delivery, (tenant, conv, seq, *message, *delivery), c)],
        "heads": [(st.heads, (tenant, conv, *head), c)],
        "conversation_states": [(st.conversation_states, (tenant, conv, sender, *state), c)],
        "user_states": [(st.user_states, (tenant, sender, conv, *state), u)],
        "session_states": [(st.session_states, (tenant, sender, conv, b"\x01" * 40), u)],
        "mailbox_floors": [(st.mailbox_floors, (tenant, sender, 0), u)],
        "user_state_blobs": [(st.user_state_blobs, (tenant, sender, conv, b"\x01" * 40, 0), u)],
    }


def batches(rows: list[Row], size: int) -> Iterator[tuple[BatchStatement, tuple[()]]]:
    """UNLOGGED batches of up to `size` rows, a partition's rows of every table together
    (consecutive, so in one batch: one mutation, as the worker's writer puts them)."""
    rows = sorted(rows, key=lambda r: r[2])
    for i in range(0, len(rows), size):
        b = BatchStatement(batch_type=BatchType.UNLOGGED)
        for prepared, values, _ in rows[i : i + size]:
            b.add(prepared, values)
        yield b, ()


def run(
    session: Session, st: Statements, pid: int, tables: set[str], args: argparse.Namespace, start: int
) -> tuple[float, float]:
    """Cassandra's CPU a message (us) and messages/s for one variant."""
    units = []
    for u0 in range(start, start + args.messages, args.unit):
        a: list[Row] = []
        b: list[Row] = []
        for n in range(u0, min(u0 + args.unit, start + args.messages)):
            by_table = message_rows(st, n, args.members, args.users, args.groups)
            for table, rows in by_table.items():
                if table in tables:
                    (b if rows[0][2][0] == "c" else a).extend(rows)
        units.append((list(batches(a, args.batch_rows)), list(batches(b, args.batch_rows))))
    until_idle(pid, IDLE, steps=30)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    for round_a, round_b in units:
        for rnd in (round_a, round_b):
            if rnd:
                execute_concurrent(session, rnd, concurrency=len(rnd), raise_on_first_error=True)
    wall = time.monotonic() - t0
    return (until_idle(pid, IDLE, steps=30) - c0) * 1e6 / args.messages, args.messages / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=15000)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--users", type=int, default=20000)
    ap.add_argument("--unit", type=int, default=250, help="messages a unit (the worker's at 500 msg/s: ~250)")
    ap.add_argument("--batch-rows", type=int, default=250, help="rows an UNLOGGED batch (the worker's: 250)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    args = ap.parse_args()
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; one of {', '.join(VARIANTS)}")
    pid = cassandra_pid()
    cluster = Cluster(["127.0.0.1"], port=PORT)
    session = cluster.connect()
    ks = "costs_" + uuid.uuid4().hex[:8]
    create_schema(session, ks, 1, "", ALL_TABLES)
    st = Statements(session, ks)
    print(
        f"{args.messages} messages a run to groups of {args.members} ({args.groups} groups, {args.users} users), "
        f"units of {args.unit}, batches of {args.batch_rows} rows; Cassandra's CPU counted until it idles; keyspace {ks}"
    )
    results: dict[str, list[float]] = {n: [] for n in names}
    start = 0
    try:
        for r in range(args.rounds):
            for name in names:
                tables = {t for part in VARIANTS[name] for t in TABLE_SETS.get(part, (part,))}
                us, rate = run(session, st, pid, tables, args, start)
                start += args.messages
                results[name].append(us)
                print(
                    f"  round {r + 1} {name:16s} Cassandra {us:7.1f} us a message   ({rate:,.0f} messages/s)",
                    flush=True,
                )
        print("median Cassandra CPU a message, and what a part costs (all minus the variant without it):")
        med = {n: statistics.median(v) for n, v in results.items()}
        for n in names:
            print(f"  {n:16s} {med[n]:7.1f} us")
        if "all" in med:
            for part in ("mailbox", "conversation", "sender"):
                if f"no-{part}" in med:
                    print(f"  the {part} writes: {med['all'] - med[f'no-{part}']:7.1f} us a message")
    finally:
        session.execute(f"DROP KEYSPACE {ks}", timeout=120)
        cluster.shutdown()


if __name__ == "__main__":
    main()
