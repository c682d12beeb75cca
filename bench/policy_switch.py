"""The cost of a write-policy switch in a 100k-member group.

    .venv/bin/python bench/policy_switch.py [--members 100000]

Switching to mention_only makes every silent member *start* being skipped at the
next message, and a rollback makes them all *stop* at the next one: those two
messages write a gap row per silent member (ADR 0002: rows change on transitions
only). This prints the projection time of the messages around both switches."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from domain.params import Parameters
from fanout.bootstrap import bootstrap
from fanout.config import Settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100_000)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fanout-switch-bench-"))
    clock = [1_800_000_000.0]
    params = dataclasses.replace(
        Parameters(), tenant_fanout_quota_capacity=1e12, tenant_fanout_quota_refill_per_sec=1e12
    )
    try:
        with bootstrap(Settings.embedded(root, params), clock=lambda: clock[0]) as rt:
            app = rt.app
            app.create_conversation("bench", "big", "", [f"u{i:06d}" for i in range(args.members)])
            rt.runner.catch_up()

            def send(i: int) -> float:
                clock[0] += 3.1
                app.send_message("bench", "big", sender=f"u{i:06d}", text=f"m{i}")
                t0 = time.perf_counter()
                rt.runner.catch_up()
                return (time.perf_counter() - t0) * 1000

            print(f"always                              {send(1):7.0f} ms")
            review = app.open_review("bench", "large", "manual", {}, "bench")
            app.decide_review("bench", review["review_id"], "enable_mention_only", "bench", 1000, 0.5)
            clock[0] += 8 * 86_400  # everyone silent; past the 24 h interval
            app.evaluate_conversation("bench", "big")
            rt.runner.catch_up()
            assert rt.queries.head("bench", "big")["write_policy"] == "mention_only"
            print(f"first mention_only (gaps start)     {send(2):7.0f} ms")
            print(f"next mention_only                   {send(3):7.0f} ms")
            app.roll_back_tier("bench", "large", "bench", "bench")
            rt.runner.catch_up()
            print(f"first always after rollback (close) {send(4):7.0f} ms")
            print(f"next always                         {send(5):7.0f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
