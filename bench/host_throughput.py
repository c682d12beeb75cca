"""The projection host's own rate (ADR-0029): events/s applied by `streams/host.py`
ProjectionHost over the in-memory and the SQLite views in-process, and by one
`python -m cli.worker` subprocess over SQLite views from a real Kafka topic (the engines of
`make engines-up`, $FANOUT_ENGINES_DIR/engines.env), on a log of MESSAGES sends to 20
conversations of 50.

    .venv/bin/python bench/host_throughput.py [MESSAGES]     # default 4000

Prints numbers; asserts nothing."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.memory import MemoryViews  # noqa: E402
from fanout.bootstrap import open_views  # noqa: E402
from fanout.urls import kafka_settings  # noqa: E402
from projections.hosting import PROJECTIONS  # noqa: E402
from streams.kafka import ensure_topic  # noqa: E402
from tests.distributed.test_worker import FakeRelay, WorkerProcess, sqlite_positions, worker_env  # noqa: E402
from tests.host_log import PARAMS, PARTITIONS, LogBuilder, host_for, partitioned  # noqa: E402


def bench(messages: int = 4000) -> None:
    """Events/s applied by the unit-of-work host over the in-memory and the SQLite views
    (in-process), and by one `python -m cli.worker` subprocess over SQLite views from a real
    Kafka topic (engines.env), on a log of `messages` sends to 20 conversations of 50."""
    import tempfile

    from tests.engines import infra_engines as ie
    from tests.engines import unique, with_query

    urls = ie.read_env_file()
    b = LogBuilder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    members = [f"u{i}" for i in range(50)]
    for c in range(20):
        b.app.create_conversation("acme", f"c{c}", f"c{c}", members)
    for i in range(messages):
        b.clock.advance(1.0)
        b.app.send_message("acme", f"c{i % 20}", sender=members[i % 50], text=f"m{i}", mentions=[members[(i + 1) % 50]])
    notes = b.notes()
    events = len(notes)
    print(f"log: {events} events ({messages} messages, {messages * 50} mailbox entries)")
    for name in ("memory", "sqlite"):
        tmp = Path(tempfile.mkdtemp())
        views = MemoryViews() if name == "memory" else open_views(tmp, PARAMS.mailbox_shards)
        host = host_for(b, views)
        started = time.perf_counter()
        for p, records in partitioned(notes).items():
            for i in range(0, len(records), 500):
                host.apply(p, records[i : i + 500])
        took = time.perf_counter() - started
        print(f"host over {name} views, batches of 500: {events / took:,.0f} events/s ({took:.2f} s)")
        views.close()
    topic_url = with_query(urls["FANOUT_LOG"], topic=unique("bench"), partitions=PARTITIONS)
    kafka = kafka_settings(topic_url)
    ensure_topic(kafka.brokers, kafka.topic, PARTITIONS)
    FakeRelay(kafka.brokers, kafka.topic).send_notes(notes, chunk=500)
    tmp = Path(tempfile.mkdtemp())
    worker = WorkerProcess(worker_env(urls["FANOUT_EVENT_STORE"], topic_url, "sqlite", tmp / "v"), tmp / "w.log")
    try:
        read = sqlite_positions(tmp / "v")
        first = None
        while True:
            pos = read()
            if first is None and any(pos.values()):
                first = time.perf_counter()
            if pos and all(pos.get((n, p), 0) >= notes[-1].id for n in PROJECTIONS for p in range(PARTITIONS)):
                break
            assert worker.proc.poll() is None, worker.output()
            time.sleep(0.05)
        took = time.perf_counter() - (first or time.perf_counter())
        print(
            f"one worker subprocess, SQLite views, from Kafka: {events / took:,.0f} events/s after its first commit ({took:.2f} s)"
        )
    finally:
        worker.stop()
    b.close()


if __name__ == "__main__":
    bench(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
