"""Open what a process of the distributed runtime opens at start-up, and nothing more, for
the start-up race tests (test_startup.py): the event store as every worker, relay and
replica opens it (its tables created if absent), and the event topic and the pushes topic
as the worker and the relay create them.

    python -m tests.distributed.open_stores [views]

The process imports everything first, prints `READY` and waits for a line on stdin, so the
processes a test starts together open the stores at the same moment (the test writes the
line to all of them once all are ready), not one import time apart. `views`: also the
Cassandra keyspace and its tables. The engine URLs come from FANOUT_EVENT_STORE, FANOUT_LOG
and FANOUT_VIEWS. Prints `OPENED` and exits 0, or `FAILED` with the error's first line and
exits 1."""

from __future__ import annotations

import os
import sys

from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap import open_cassandra_views, postgres_event_store
from fanout.urls import cassandra_settings, kafka_settings
from streams.kafka import ensure_topic, partition_count
from streams.pushes import ensure_pushes_topic, pushes_topic


def main(argv: list[str]) -> int:
    kafka = kafka_settings(os.environ["FANOUT_LOG"])
    print("READY", flush=True)
    sys.stdin.readline()
    try:
        app = FanoutApplication(Parameters(), postgres_event_store(os.environ["FANOUT_EVENT_STORE"]), shared_store=True)
        app.close()
        # the event topic as the worker creates it (then counts its partitions) and as the relay does
        ensure_topic(kafka.brokers, kafka.topic, kafka.partitions, kafka.replication)
        partition_count(kafka.brokers, kafka.topic)
        ensure_topic(kafka.brokers, kafka.topic, kafka.partitions, kafka.replication)
        ensure_pushes_topic(kafka.brokers, pushes_topic(kafka.topic), kafka.partitions, kafka.replication, 0)
        if "views" in argv:
            open_cassandra_views(cassandra_settings(os.environ["FANOUT_VIEWS"]), partitions=kafka.partitions).close()
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"FAILED {type(exc).__name__}: {first}", flush=True)
        return 1
    print("OPENED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
