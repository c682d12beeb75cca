"""SESSION_LIST_BATCH from the embedded runtime over the WebSocket: the login of
bench/cassandra_sessions.py, the same build and the same client, on `fanout serve` over a data
dir instead of the distributed runtime, so that the two runtimes' logins compare like with like
(bench/headline.py runs both).

    .venv/bin/python bench/embedded_sessions.py                        # 5,000 conversations, 20 logins
    .venv/bin/python bench/embedded_sessions.py --conversations 300 --repeats 5   # smoke

1. The user's conversations are built in this process through the embedded runtime over a
   temporary data dir (`cassandra_sessions.build`: each created with the user and one other
   member, who sends one message; the runtime's clock set back so that their last activity
   spreads over --spread-hours), projected, and the runtime closed.
2. `fanout serve` starts over that data dir (the admission gates opened wide), and the user logs
   in over /v1/ws (`cassandra_sessions.websocket_report`): AUTH sent -> the first
   SESSION_LIST_BATCH and -> the one marked last, the serve's first login of the user apart,
   then --repeats more, p50 / p90 / max, and the CPU of the serve and of this process a login.

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cassandra_sessions import build, websocket_report  # noqa: E402
from distributed_common import OPEN_GATES, Fleet, MemoryWatch, exit_on_sigterm  # noqa: E402
from durability import embedded as durability_in_force  # noqa: E402

from fanout.bootstrap import bootstrap  # noqa: E402
from fanout.config import load_settings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--spread-hours", type=float, default=720.0, help="as bench/cassandra_sessions.py's")
    args = ap.parse_args()

    exit_on_sigterm()
    print(durability_in_force(), flush=True)
    data = Path(tempfile.mkdtemp(prefix="fanout-bench-sessions-"))
    fleet = Fleet({}, OPEN_GATES)
    watch = MemoryWatch()
    try:
        behind = [0.0]
        with bootstrap(load_settings(OPEN_GATES, data_dir=data), clock=lambda: time.time() - behind[0]) as rt:
            rt.start()
            build(rt, args.conversations, args.spread_hours, behind)
        t = time.monotonic()
        base = fleet.start_serve(data).base
        print(f"fanout serve (embedded) up in {time.monotonic() - t:.1f} s over {data}", flush=True)
        watch.watch("serve", partial(list, [fleet.procs["serve"].pid]))
        watch.watch("this process (the client)", partial(list, [os.getpid()]))
        websocket_report(base, watch, args, "the serve's first login of the user")
    finally:
        fleet.stop()
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
