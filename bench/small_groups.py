"""Many small groups: the command side (sends accepted per second, one writer) and
the projection (messages projected per second) of the embedded runtime.

    .venv/bin/python bench/small_groups.py [--groups 50] [--members 20] [--messages 3000] [--group 32]

--group N sends N at a time through `FanoutApplication.grouped` (one event-store transaction
for the N, as the HTTP command lane does with the sends queued behind one: ADR-0030); 1, the
default, is one transaction per send.

The gates are opened wide and a fake clock is used: this measures the machinery, not
the limits. Prints numbers; asserts nothing."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

from durability import embedded as durability_in_force
from group_members import add_users_option
from group_members import member as group_member

from domain.params import Parameters, Rate
from fanout.bootstrap import bootstrap
from fanout.config import Settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=50)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--group", type=int, default=1, help="sends per event-store transaction (ADR-0030)")
    add_users_option(ap)
    args = ap.parse_args()
    member = partial(group_member, members=args.members, users=args.users)
    print(durability_in_force(), flush=True)

    root = Path(tempfile.mkdtemp(prefix="fanout-small-bench-"))
    clock = [1_800_000_000.0]
    params = dataclasses.replace(Parameters(), rate_small=1e6, per_sender_in_conversation_rate=Rate(1e6, 1.0))
    try:
        with bootstrap(Settings.embedded(root, params), clock=lambda: clock[0]) as rt:
            for g in range(args.groups):
                rt.app.create_conversation("bench", f"g{g}", "", [member(g, i) for i in range(args.members)])
            rt.runner.catch_up()
            t0 = time.perf_counter()
            cpu0 = time.process_time()
            for first in range(0, args.messages, args.group):
                calls = []
                for i in range(first, min(first + args.group, args.messages)):
                    clock[0] += 0.001
                    calls.append(
                        partial(
                            rt.app.send_message,
                            "bench",
                            f"g{i % args.groups}",
                            sender=member(i % args.groups, i % args.members),
                            text="hi",
                        )
                    )
                for _, exc in rt.app.grouped(calls) if len(calls) > 1 else [(calls[0](), None)]:
                    if exc is not None:
                        raise exc
            t1 = time.perf_counter()
            cpu1 = time.process_time()
            rt.runner.catch_up()
            t2 = time.perf_counter()
            cpu2 = time.process_time()
            n = args.messages
            print(f"{args.groups} groups of {args.members}: {n} sends")
            how = "event store commit per send" if args.group == 1 else f"groups of {args.group}, one commit each"
            print(
                f"  command side  {n / (t1 - t0):,.0f} sends accepted/s ({how}); "
                f"{(cpu1 - cpu0) / n * 1e6:,.0f} us of CPU a send"
            )
            print(f"  projection    {n / (t2 - t1):,.0f} messages/s = {n * args.members / (t2 - t1):,.0f} entries/s")
            print(f"  CPU of the process, sends and projection: {(cpu2 - cpu0) / n * 1e3:.2f} ms a message")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
