"""What a unit of work's size does to the cost of a small-group message on Cassandra (ADR-0052):
the projection host (`streams/host.py`, the worker's) applies the same log of sends to 1,000
groups of 20 members of their own, in takes of `--sizes` events each, over Cassandra views in a
fresh keyspace per size (the engines of `make engines-up`, $FANOUT_ENGINES_DIR/engines.env).
Prints per size: wall time, this process's CPU and Cassandra's CPU a message, and how long
the commit's rounds waited (round A: member rows and the mailbox; round B: the conversations'
batches; the session heads' copy; tracking).

    .venv/bin/python bench/cassandra_unit_sizes.py                       # 10,000 sends, 250,1000,4000
    .venv/bin/python bench/cassandra_unit_sizes.py --sends 5000 --sizes 500,2000 --rounds 2

In-process: no Kafka, no Faust, no API replica; the events are written by the embedded
application first (PersistenceModule popo) and partitioned as the relay would. Prints
numbers; asserts nothing."""

from __future__ import annotations

import argparse
import collections
import inspect
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed_common import cpu_seconds, engine_pid  # noqa: E402

import adapters.cassandra.views as cassandra_views  # noqa: E402
from fanout.bootstrap.replica import open_cassandra_views  # noqa: E402
from fanout.urls import cassandra_settings  # noqa: E402
from tests.engines import infra_engines  # noqa: E402
from tests.host_log import PARTITIONS, LogBuilder, host_for, partitioned  # noqa: E402


class RoundTimer:
    """Wraps the views module's `run` (one round of requests) to sum the time each round of
    `_commit` waits, keyed by the step the writer last entered."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = collections.defaultdict(float)
        self.requests: dict[int, int] = collections.Counter()
        self.rounds: dict[int, int] = collections.Counter()
        self._run = cassandra_views.run

    def __enter__(self) -> RoundTimer:
        def timed(session: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
            requests = list(requests)
            caller = inspect.currentframe()
            line = caller.f_back.f_lineno if caller is not None and caller.f_back is not None else 0
            started = time.perf_counter()
            try:
                return self._run(session, requests, *args, **kwargs)
            finally:
                self.seconds[line] += time.perf_counter() - started
                self.requests[line] += len(requests)
                self.rounds[line] += 1

        cassandra_views.run = timed
        return self

    def __exit__(self, *exc: Any) -> None:
        cassandra_views.run = self._run


def build_log(groups: int, members: int, sends: int) -> tuple[LogBuilder, list[Any], list[Any]]:
    b = LogBuilder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    for g in range(groups):
        b.app.create_conversation("acme", f"c{g}", f"c{g}", [f"u{g * members + i}" for i in range(members)])
    created = len(b.notes())
    for i in range(sends):
        b.clock.advance(0.002)
        g = i % groups
        b.app.send_message("acme", f"c{g}", sender=f"u{g * members + (i // groups) % members}", text=f"m{i}")
    notes = b.notes()
    return b, notes[:created], notes[created:]


def measure(b: LogBuilder, creates: list[Any], sends: list[Any], size: int, messages: int, views_url: str) -> None:
    keyspace = "unit_sizes_" + uuid.uuid4().hex[:8]
    views = open_cassandra_views(cassandra_settings(f"{views_url.rsplit('/', 1)[0]}/{keyspace}"), partitions=PARTITIONS)
    try:
        host = host_for(b, views)
        for p, records in partitioned(creates).items():
            for i in range(0, len(records), 500):
                host.apply(p, records[i : i + 500])
        takes = [(p, rs[i : i + size]) for p, rs in partitioned(sends).items() for i in range(0, len(rs), size)]
        pid = engine_pid("cassandra")
        if pid is None:
            raise SystemExit("Cassandra is not running: make engines-up")
        time.sleep(3)  # the creation's flushes settle
        k0, c0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
        with RoundTimer() as timer:
            for p, records in takes:
                host.apply(p, records)
        took, cpu, cass = time.perf_counter() - t0, time.process_time() - c0, cpu_seconds(pid) - k0
        print(
            f"  units of {size:>5} events ({len(takes)} units): {messages / took:>6,.0f} messages/s; "
            f"a message: host {cpu / messages * 1e6:>4.0f} us, Cassandra {cass / messages * 1e6:>5.0f} us "
            f"({cass / took:.2f} cores)",
            flush=True,
        )
        waits = ", ".join(
            f"{timer.seconds[line]:.2f} s in {timer.rounds[line]} ({timer.requests[line] / timer.rounds[line]:.0f} requests each)"
            for line in sorted(timer.seconds)
            if timer.rounds[line] and timer.requests[line]
        )
        print(f"    the commit's rounds waited (in _commit's order): {waits}", flush=True)
    finally:
        views.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        views.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--sends", type=int, default=10_000)
    ap.add_argument("--sizes", default="250,1000,4000", help="events a unit, comma-separated (the worker's take: 500)")
    ap.add_argument("--rounds", type=int, default=1, help="each size this many times, alternating")
    args = ap.parse_args()
    views_url = infra_engines.read_env_file()["FANOUT_VIEWS"]
    b, creates, sends = build_log(args.groups, args.members, args.sends)
    print(f"{args.sends:,} sends to {args.groups:,} groups of {args.members} ({len(sends):,} events in the log)")
    try:
        for _ in range(args.rounds):
            for size in (int(x) for x in args.sizes.split(",")):
                measure(b, creates, sends, size, args.sends, views_url)
    finally:
        b.close()


if __name__ == "__main__":
    main()
