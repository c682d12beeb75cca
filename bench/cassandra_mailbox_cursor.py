"""What a mailbox cursor read costs on the Cassandra mailbox (ADR-0038: partitions by hour, a
cursor read walks the tenant's hours) in a tenant with --hours hours of history, on the running
node, in a fresh keyspace dropped afterwards. One message an hour to "old"; one last message to
"new" and "old". Printed for three reads (median of --repeats): a new user's first page
(cursor 0: every hour of the tenant is a candidate), an old user's first page, an old user's
last three hours; the read's wall time and Cassandra's CPU for it.

    .venv/bin/python bench/cassandra_mailbox_cursor.py                 # 1,000 hours
    .venv/bin/python bench/cassandra_mailbox_cursor.py --hours 8760    # a year
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.cassandra.mailbox import CassandraMailbox  # noqa: E402
from bench.cassandra_mailbox_layouts import cassandra_cpu  # noqa: E402
from projections.ports import MessageRefs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=int(os.environ.get("FANOUT_ENGINES_CASSANDRA_PORT", "19042")))
    ap.add_argument("--hours", type=int, default=1000, help="hours of the tenant's history (1000)")
    ap.add_argument("--repeats", type=int, default=5, help="reads of each kind (5)")
    ap.add_argument("--limit", type=int, default=50, help="entries a page (50)")
    a = ap.parse_args()
    store = CassandraMailbox.connect(["127.0.0.1"], a.port, f"bench_cursor_{uuid.uuid4().hex[:8]}")
    try:
        base = 472_222 * 3600.0
        for h in range(a.hours):
            store.write("t", MessageRefs("g", h + 1, h + 1, 0, {}, {0: ["old"]}, at=base + h * 3600))
        last = a.hours + 1
        store.write("t", MessageRefs("g", last, last, 0, {}, {0: ["new", "old"]}, at=base + (a.hours - 1) * 3600 + 60))
        reads = (("a new user's first page (cursor 0)", "new", 0), ("an old user's first page (cursor 0)", "old", 0),
                 ("an old user's last 3 hours", "old", a.hours - 3))  # fmt: skip
        for name, user, after in reads:
            took, cpu0, got = [], cassandra_cpu(), []
            for _ in range(a.repeats):
                t = time.perf_counter()
                got = store.read("t", user, after, 1 << 62, a.limit)
                took.append(time.perf_counter() - t)
            cpu = (cassandra_cpu() - cpu0) / a.repeats
            print(f"{a.hours:,} hours of history, {name}: {len(got)} entries, {statistics.median(took) * 1000:.1f} ms "
                  f"a read (median of {a.repeats}), Cassandra {cpu * 1000:.0f} ms of CPU a read", flush=True)  # fmt: skip
    finally:
        store.session.execute(f"DROP KEYSPACE {store.keyspace}", timeout=120)
        store.close()


if __name__ == "__main__":
    main()
