"""The relay (streams/relay.py) on the real engines: events/s from the PostgreSQL event store
to Kafka, batched transactions (the relay as it runs: up to 500 events per transaction,
each ending with a watermark on every partition) against a naive relay (one transaction
per event, the same watermarks), in the same run, on the same log.

    .venv/bin/python bench/relay_throughput.py [--events 20000] [--naive-events 1000] [--partitions 6]
        [--store postgresql://postgres@127.0.0.1:15432/fanout] [--log kafka://127.0.0.1:19092]

Defaults come from FANOUT_EVENT_STORE / FANOUT_LOG (or /tmp/fanout-engines/engines.env). A fresh
database (created next to the one named, dropped at the end) and fresh topics (deleted at the
end) are used. The log is a real story (conversations, joins, sends, quota charges) written
through FanoutApplication, then copied under fresh aggregate ids up to --events. Each relay
is timed from run() (subscribe) to the commit of the last position it is asked for
(start-up: topic, init_transactions and the position read, is reported apart). Prints numbers; asserts nothing."""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from confluent_kafka.admin import AdminClient
from eventsourcing.persistence import StoredEvent

from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap import postgres_event_store
from fanout.clock import FakeClock
from fanout.config import RelayOptions
from fanout.urls import KafkaSettings, kafka_settings
from streams.relay import Relay

ENGINES_ENV = Path(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines")) / "engines.env"


def engine_urls() -> dict[str, str]:
    urls = {}
    if ENGINES_ENV.exists():
        for line in ENGINES_ENV.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                k, v = line.split("=", 1)
                urls[k.strip()] = v.strip()
    for k in ("FANOUT_EVENT_STORE", "FANOUT_LOG"):
        if os.environ.get(k):
            urls[k] = os.environ[k]
    return urls


def with_db(url: str, db: str) -> str:
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, "/" + db, u.query, ""))


def write_log(env: dict[str, str], events: int) -> int:
    """A real story, then copies of its conversation and quota events under fresh ids."""
    clock = FakeClock()
    app = FanoutApplication(Parameters(), env, clock=clock)
    try:
        for c in range(20):
            app.create_conversation("bench", f"c{c}", f"C{c}", [f"u{i}" for i in range(50)])
        for i in range(200):
            clock.advance(3.1)
            app.send_message("bench", f"c{i % 20}", sender=f"u{i % 50}", text=f"message {i} " + "x" * 80)
        story = [
            n
            for n in app.recorder.select_notifications(None, 100_000)
            if n.topic.startswith(("domain.conversation:", "domain.quota:"))
        ]
        top = app.log_position()
        copy = 0
        while top < events:
            copy += 1
            ids: dict[Any, uuid.UUID] = {}
            chunk = [
                StoredEvent(
                    originator_id=ids.setdefault(n.originator_id, uuid.uuid4()),
                    originator_version=n.originator_version,
                    topic=n.topic,
                    state=n.state,
                )
                for n in story[: events - top]
            ]
            for k in range(0, len(chunk), 1000):
                app.recorder.insert_events(chunk[k : k + 1000])
            top = app.log_position()
        return top
    finally:
        app.close()


def measure(
    env: dict[str, str], brokers: str, topic: str, partitions: int, upto: int, batch: int
) -> dict[str, float]:
    app = FanoutApplication(Parameters(), env)
    relay = Relay(
        app,
        KafkaSettings(brokers, topic, partitions),
        batch=batch,
        commit_interval=RelayOptions().commit_interval if batch > 1 else 0,
        log_interval=RelayOptions().log_interval,
    )
    t0 = time.perf_counter()
    relay.start()
    started = time.perf_counter()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            relay.run()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    began = time.perf_counter()
    t.start()
    while relay.position < upto and not errors:
        time.sleep(0.01)
    done = time.perf_counter()
    relay.stop()
    t.join(60)
    app.close()
    if errors:
        raise errors[0]
    return {
        "startup_s": started - t0,
        "seconds": done - began,
        "events": relay.stats.events,
        "transactions": relay.stats.transactions,
        "events_per_s": relay.stats.events / (done - began),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    urls = engine_urls()
    ap.add_argument("--events", type=int, default=20_000, help="events in the log (default 20000)")
    ap.add_argument("--naive-events", type=int, default=1000, help="events the naive relay relays (default 1000)")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--store", default=urls.get("FANOUT_EVENT_STORE"), help="a postgresql:// URL on the server to use")
    ap.add_argument("--log", default=urls.get("FANOUT_LOG"), help="a kafka:// URL")
    args = ap.parse_args()
    if not args.store or not args.log:
        raise SystemExit("bench: give --store and --log (or FANOUT_EVENT_STORE / FANOUT_LOG, or run make engines-up)")
    db = f"bench_relay_{uuid.uuid4().hex[:8]}"
    admin_url = with_db(args.store, "postgres")
    brokers = kafka_settings(args.log).brokers
    topics = [f"bench-relay-{uuid.uuid4().hex[:8]}", f"bench-relay-naive-{uuid.uuid4().hex[:8]}"]
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    try:
        env = postgres_event_store(with_db(args.store, db))
        t0 = time.perf_counter()
        top = write_log(env, args.events)
        print(f"log: {top} events written in {time.perf_counter() - t0:.1f}s (database {db})")
        batched = measure(env, brokers, topics[0], args.partitions, top, args.batch)
        naive_upto = min(top, args.naive_events)
        naive = measure(env, brokers, topics[1], args.partitions, naive_upto, 1)
        print(f"kafka {brokers}, {args.partitions} partitions, acks=all, idempotent transactional producer")
        for name, r in ((f"batched (<= {args.batch}/txn)", batched), ("naive (1 event/txn)", naive)):
            print(
                f"{name:<22} {int(r['events']):>7} events in {r['seconds']:7.2f}s = {r['events_per_s']:9.0f} events/s "
                f"({int(r['transactions'])} transactions; start-up {r['startup_s']:.2f}s)"
            )
        print(f"batched / naive: {batched['events_per_s'] / naive['events_per_s']:.1f}x")
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin = AdminClient({"bootstrap.servers": brokers})
        for f in admin.delete_topics(topics, operation_timeout=10).values():
            with contextlib.suppress(Exception):
                f.result(15)


if __name__ == "__main__":
    main()
