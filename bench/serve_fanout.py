"""The fan-out benchmark through a real `fanout serve`, over HTTP, sampling the
server's RSS: what a backend service sees, and what the process costs.

    .venv/bin/python bench/serve_fanout.py                       # numbers in docs/PERFORMANCE.md
    .venv/bin/python bench/serve_fanout.py --members 20000 --prefill-messages 5

The server runs with the admission gates opened wide (FANOUT_PER_CONVERSATION_MSG_RATE,
FANOUT_PER_SENDER_IN_CONVERSATION_RATE, the tenant quota) so the projector, not the
2 msg/s gate, is what is measured. Prints numbers; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from distributed_common import MemoryWatch
from durability import embedded as durability_in_force


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(base: str, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body is not None else None, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)


def wait_materialized(base: str, token: str, seq: int) -> float:
    while True:
        status, rec = call(base, token, "GET", f"/v1/conversations/big/messages/{seq}/delivery")
        if status == 200 and rec["materialized_at"] is not None:
            return float(rec["materialized_at"])
        time.sleep(0.002)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--prefill-messages", type=int, default=100)
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--latency-messages", type=int, default=10)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="fanout-serve-bench-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "FANOUT_PER_CONVERSATION_MSG_RATE": "100000/100000/100000",
        "FANOUT_PER_SENDER_IN_CONVERSATION_RATE": "100000/1s",
        "FANOUT_TENANT_FANOUT_QUOTA_CAPACITY": "1e12",
        "FANOUT_TENANT_FANOUT_QUOTA_REFILL": "1e12",
        "FANOUT_SECRET": "bench-secret-bench-secret-bench-secret",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--data-dir", str(root), "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from fanout.security import mint_token

        token = mint_token(env["FANOUT_SECRET"], "bench", "service", "bench")
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        sampler = RssSampler(server.pid)
        sampler.start()
        print(durability_in_force(), flush=True)
        watch = MemoryWatch()  # CPU seconds of the server and of this process (the client)
        watch.watch("fanout serve", lambda: [server.pid])
        watch.watch("this process (the client)", lambda: [os.getpid()])
        users = [f"u{i:06d}" for i in range(args.members)]
        call(base, token, "POST", "/v1/conversations", {"conversation_id": "big", "title": "bench"})
        for i in range(0, len(users), 50_000):
            status, r = call(base, token, "POST", "/v1/conversations/big/members", {"user_ids": users[i : i + 50_000]})
            assert status == 200, r

        t0 = time.perf_counter()
        seq = 0
        for i in range(args.prefill_messages):
            status, r = call(base, token, "POST", "/v1/conversations/big/messages", {"sender": users[i], "text": f"m{i}"})
            assert status == 201, r
            seq = r["conversation_seq"]
        wait_materialized(base, token, seq)
        print(
            f"prefill: {args.members * args.prefill_messages:,} entries via HTTP in {time.perf_counter() - t0:.1f}s",
            file=sys.stderr,
        )

        cpu0 = watch.cpu()
        t0 = time.perf_counter()
        for i in range(args.messages):
            status, r = call(base, token, "POST", "/v1/conversations/big/messages", {"sender": users[i], "text": f"b{i}"})
            assert status == 201, r
            seq = r["conversation_seq"]
        wait_materialized(base, token, seq)
        burst = time.perf_counter() - t0
        cpu1 = watch.cpu()

        lat = []
        for i in range(args.latency_messages):
            status, r = call(base, token, "POST", "/v1/conversations/big/messages", {"sender": users[i], "text": f"l{i}"})
            accepted = time.time()
            lat.append((wait_materialized(base, token, r["conversation_seq"]) - accepted) * 1000)
        sampler.stop.set()
        sampler.join()
        entries = args.members * args.messages
        print(f"serve over HTTP, {args.members:,} members, {args.members * args.prefill_messages:,} entries stored first")
        print(f"  burst        {args.messages} messages = {entries:,} entries materialized in {burst:.2f}s = {entries / burst:,.0f} entries/s")
        print("  " + watch.cpu_report(cpu0, cpu1, burst))
        print(
            f"  latency      send accepted -> materialized_at p50 {statistics.median(lat):.0f} ms, max {max(lat):.0f} ms"
        )
        print(f"  peak RSS     {sampler.peak / 2**20:.0f} MiB (fanout serve, sampled every 20 ms)")
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
