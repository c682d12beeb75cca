"""Per-node cost of the distributed runtime on the three-node cluster at RF 3 (ADR-0027),
the capacity arithmetic checked against a measurement.

    make cluster-up
    .venv/bin/python bench/cluster_cost.py                          # 10,000 members, 20 messages
    .venv/bin/python bench/cluster_cost.py --members 2000 --messages 5  # smoke

On the cluster of $FANOUT_CLUSTER_DIR/cluster.env (RF 3 at LOCAL_QUORUM, 3 Kafka replicas with
min.insync.replicas=2): a namespace of its own (database, topic, keyspace; dropped at the end),
`fanout relay` and one `fanout worker` as subprocesses, this process as the API replica, the
admission gates and backpressure opened wide. A --members group is created and projected; then
--messages sends are issued at once and the time until this replica sees the views hold the
last one gives mailbox entries/s. Meanwhile: CPU seconds of every process (/proc/PID/stat:
each Cassandra node, each Kafka broker, the relay, the worker, this process, PostgreSQL's
processes) per mailbox entry and per send, and the bytes the event topic and the pushes topic
grew by in each broker's log directory, per send. Prints numbers; asserts nothing."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from distributed_common import OPEN_GATES, cpu_seconds  # noqa: E402

from tests.distributed.cluster import cluster_for, create_namespace, drop_namespace  # noqa: E402

CLUSTER_DIR = Path(os.environ.get("FANOUT_CLUSTER_DIR", "/tmp/fanout-cluster"))


def cluster_env() -> dict[str, str]:
    out = {}
    for line in (CLUSTER_DIR / "cluster.env").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def pid_of(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def processes(c: object) -> dict[str, list[int]]:
    import psutil

    procs: dict[str, list[int]] = {}
    for n in (1, 2, 3):
        for engine, pidfile in (("cassandra", "cassandra.pid"), ("kafka", "kafka.pid")):
            pid = pid_of(CLUSTER_DIR / f"{engine}-{n}" / pidfile)
            if pid:
                procs[f"{engine}-{n}"] = [pid]
    pg = pid_of(CLUSTER_DIR / "postgres" / "postgres.pid")
    if pg:
        procs["postgres"] = [pg] + [p.pid for p in psutil.Process(pg).children(recursive=True)]
    for name, proc in c.procs.items():  # type: ignore[attr-defined]
        procs[name] = [proc.pid]
    procs["replica (this process)"] = [os.getpid()]
    return procs


def cpu(procs: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(p) for p in pids) for name, pids in procs.items()}


def topic_bytes(topic: str) -> dict[str, int]:
    """Bytes of the topic's (and its pushes topic's) log segments in each broker's data dir."""
    out = {}
    for n in (1, 2, 3):
        total = 0
        for d in (CLUSTER_DIR / f"kafka-{n}" / "data").glob(f"{topic}*-*"):
            total += sum(f.stat().st_size for f in d.glob("*.log"))
        out[f"kafka-{n}"] = total
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=6)
    args = ap.parse_args()
    engines = cluster_env()
    urls = create_namespace(engines, args.partitions, schema=True)
    import tempfile

    c = cluster_for(urls, Path(tempfile.mkdtemp(prefix="cluster-cost-")), **OPEN_GATES)
    try:
        rt = c.replica()
        c.start("relay")
        c.start("worker")
        members = [f"u{i:06d}" for i in range(args.members)]
        t0 = time.monotonic()
        rt.app.create_conversation("acme", "big", "bench", members)
        c.wait_workers(1, timeout=180)
        c.settle(rt, timeout=600)
        print(f"{args.members}-member group created and projected in {time.monotonic() - t0:.1f} s", flush=True)
        topic = urls["FANOUT_LOG"].split("topic=")[1].split("&")[0]
        procs = processes(c)
        cpu0, bytes0, t0 = cpu(procs), topic_bytes(topic), time.monotonic()
        for i in range(args.messages):
            rt.app.send_message("acme", "big", sender=members[i % 3], text=f"cost {i} " + "x" * 60, client_msg_id=f"c{i}")
        sent = time.monotonic() - t0
        c.settle(rt, timeout=1800)
        took = time.monotonic() - t0
        cpu1, bytes1 = cpu(procs), topic_bytes(topic)
        entries = args.messages * args.members
        print(
            f"{args.messages} sends into {args.members} members: accepted in {sent:.2f} s, views hold the last "
            f"after {took:.1f} s: {entries} mailbox entries, {entries / took:,.0f} entries/s (wall, RF 3)"
        )
        print(f"{'process':<24} {'CPU s':>8} {'us/entry':>9} {'ms/send':>8}")
        total = 0.0
        for name in procs:
            d = cpu1[name] - cpu0[name]
            total += d
            print(f"{name:<24} {d:8.2f} {d / entries * 1e6:9.2f} {d / args.messages * 1e3:8.1f}")
        print(f"{'all':<24} {total:8.2f} {total / entries * 1e6:9.2f} {total / args.messages * 1e3:8.1f}")
        for b in bytes1:
            grew = bytes1[b] - bytes0[b]
            print(f"{b}: event + pushes topics grew {grew:,} bytes = {grew / args.messages:,.0f} bytes/send")
        allb = sum(bytes1.values()) - sum(bytes0.values())
        print(f"all brokers: {allb / args.messages:,.0f} bytes/send on disk (3 replicas)")
    finally:
        c.close()
        drop_namespace(urls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
