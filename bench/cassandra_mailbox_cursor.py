"""What a mailbox cursor read costs on the Cassandra mailbox (ADR-0038: partitions by hour, a
cursor read walks the tenant's hours) in a tenant with --hours hours of history, on the running
node, in a fresh keyspace dropped afterwards. One message an hour to "old"; one last message to
"new" and "old", written through the views' units of work ("old" joined in the first, "new" in
the last: their states, and so their mailbox floors, ADR-0045). Printed for three reads (median
of --repeats): a new user's first page (cursor 0), an old user's first page, an old user's last
three hours; the read's wall time and Cassandra's CPU for it, read as the API reads it
(`CassandraViews.mailbox_page`: from the user's floor on) and by the mailbox alone walking the
tenant's hours from the cursor (`CassandraMailbox.read`, as before ADR-0045: for a new user at
cursor 0 every hour of the tenant is a candidate).

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
from adapters.cassandra.views import CassandraViews  # noqa: E402
from bench.cassandra_mailbox_layouts import cassandra_cpu  # noqa: E402
from fanout.urls import cassandra_settings  # noqa: E402
from projections.ports import MessageRefs  # noqa: E402
from projections.state import UserConversationState  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=int(os.environ.get("FANOUT_ENGINES_CASSANDRA_PORT", "19042")))
    ap.add_argument("--hours", type=int, default=1000, help="hours of the tenant's history (1000)")
    ap.add_argument("--repeats", type=int, default=5, help="reads of each kind (5)")
    ap.add_argument("--limit", type=int, default=50, help="entries a page (50)")
    a = ap.parse_args()
    settings = cassandra_settings(f"cassandra://127.0.0.1:{a.port}/bench_cursor_{uuid.uuid4().hex[:8]}")
    store = CassandraMailbox.from_settings(settings)
    views = CassandraViews.from_settings(settings, store)
    try:
        base = 472_222 * 3600.0
        last = a.hours + 1
        with views.unit_of_work() as w:
            w.put_states("t", "g", [("old", UserConversationState(0, 0))])
            w.track("delivery", a.hours)
        for h in range(a.hours):
            store.write("t", MessageRefs("g", h + 1, h + 1, 0, {}, {0: ["old"]}, at=base + h * 3600))
        with views.unit_of_work() as w:  # "new" joins after every message of "old" (the host's `above`)
            w.applying(0, a.hours)
            w.put_states("t", "g", [("new", UserConversationState(0, 0))])
            w.put_mailbox(
                "t", MessageRefs("g", last, last, 0, {}, {0: ["new", "old"]}, at=base + (a.hours - 1) * 3600 + 60)
            )
            w.track("delivery", last)
        reads = (("a new user's first page (cursor 0)", "new", 0), ("an old user's first page (cursor 0)", "old", 0),
                 ("an old user's last 3 hours", "old", a.hours - 3))  # fmt: skip
        ways = (("from the floor", lambda u, after: views.mailbox_page("t", u, after, a.limit)),
                ("walking", lambda u, after: store.read("t", u, after, last, a.limit)))  # fmt: skip
        for name, user, after in reads:
            for _, read in ways:  # a warm-up of each: neither way times the other's cold caches
                read(user, after)
            for way, read in ways:
                took, cpu0, got = [], cassandra_cpu(), []
                for _ in range(a.repeats):
                    t = time.perf_counter()
                    got = read(user, after)
                    took.append(time.perf_counter() - t)
                cpu = (cassandra_cpu() - cpu0) / a.repeats
                print(f"{a.hours:,} hours of history, {name}, {way:>14}: {len(got)} entries, "
                      f"{statistics.median(took) * 1000:.1f} ms a read (median of {a.repeats}), "
                      f"Cassandra {cpu * 1000:.0f} ms of CPU a read", flush=True)  # fmt: skip
    finally:
        store.session.execute(f"DROP KEYSPACE {store.keyspace}", timeout=120)
        views.close()
        store.close()


if __name__ == "__main__":
    main()
