"""Smoke checks of the distributed runtime's three engines, with the real clients.

Reads the engine URLs from the environment (FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS) or, when
they are not set, from the env file that infra/engines/up.sh (or infra/testcontainers/engines.py)
writes: $FANOUT_ENGINES_DIR/engines.env (default /tmp/fanout-engines/engines.env).

* Kafka (confluent-kafka): create a 3-partition test topic; an idempotent producer (acks=all)
  writes 1000 keyed records; a transactional producer commits 10 records and aborts one; a
  read_committed consumer must see exactly the 1010 committed records, none aborted, each key in
  order. The topic is deleted afterwards.
* Cassandra (scylla-driver): create the keyspace named in FANOUT_VIEWS with SimpleStrategy and
  the replication factor of its `replication_factor` query parameter (default 1), a test table,
  10 UNLOGGED batches of 100 rows (one partition each, in flight together), then a partition read
  and a count. The test table is dropped afterwards (the keyspace stays).
* PostgreSQL (eventsourcing 9.5.6, PERSISTENCE_MODULE=eventsourcing.postgres with its POSTGRES_*
  settings derived from FANOUT_EVENT_STORE): a plain psycopg connection first (it names the real
  cause of a failure, which eventsourcing's pool hides behind a 30 s timeout), then save and
  reload an aggregate, read the notification log, and subscribe(): in 9.5.6 the PostgreSQL
  recorder's subscription is LISTEN/NOTIFY-based (PostgresSubscription: a thread LISTENs on the
  events table's channel, every insert NOTIFYs it, and the pull thread selects only when woken).
  The test tables are dropped afterwards.

Each step prints what it did and how long it took. Any failure prints a clear message and the
script exits 1. Usage:
    .venv/bin/python infra/engines/smoke.py [--only kafka,cassandra,postgres] [--env-file PATH]
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

KEYS = ("FANOUT_EVENT_STORE", "FANOUT_LOG", "FANOUT_VIEWS")
RUN = uuid.uuid4().hex[:8]


class SmokeFailure(Exception):
    pass


def out(engine: str, msg: str) -> None:
    print(f"[{engine}] {msg}", flush=True)


@contextmanager
def step(engine: str, what: str) -> Iterator[dict[str, Any]]:
    """Time one step; the body may put a 'detail' string into the yielded dict."""
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    yield info
    dt = time.perf_counter() - t0
    detail = f": {info['detail']}" if info.get("detail") else ""
    out(engine, f"{what} ({dt:.3f}s){detail}")


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise SmokeFailure(msg)


def load_urls(env_file: str) -> dict[str, str]:
    urls = {k: os.environ[k] for k in KEYS if os.environ.get(k)}
    if len(urls) < len(KEYS) and os.path.exists(env_file):
        with open(env_file) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    if k in KEYS:
                        urls.setdefault(k, v)
    return urls


# --------------------------------------------------------------------------------------- Kafka
def check_kafka(url: str) -> None:
    import confluent_kafka
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    u = urlparse(url)
    expect(u.scheme == "kafka" and u.hostname is not None and u.port is not None, f"FANOUT_LOG={url!r}: expected kafka://HOST:PORT")
    bs = f"{u.hostname}:{u.port}"
    E = "kafka"
    out(E, f"brokers {bs}, confluent-kafka {confluent_kafka.version()}, librdkafka {confluent_kafka.libversion()[0]}")
    topic = f"fanout-smoke-{RUN}"
    partitions = 3
    base = {"bootstrap.servers": bs, "socket.timeout.ms": 10000}
    admin = AdminClient(base)  # keep a reference until the futures resolve (else they fail with _DESTROY)
    try:
        admin.list_topics(timeout=10)
    except confluent_kafka.KafkaException as exc:
        raise SmokeFailure(f"no Kafka broker answered at {bs} within 10 s: {exc}") from None
    with step(E, f"create topic {topic} ({partitions} partitions, RF 1)") as s:
        for fut in admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30).values():
            fut.result(timeout=30)
        md = admin.list_topics(topic, timeout=10)
        s["detail"] = f"broker(s) {sorted(b.id for b in md.brokers.values())}, cluster {md.cluster_id}"
    try:
        n = 1000
        keys = 20
        errors: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        with step(E, f"idempotent producer (enable.idempotence, acks=all): {n} keyed records") as s:
            p = Producer({**base, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
            for i in range(n):
                p.produce(topic, key=f"k{i % keys}".encode(), value=f"idem-{i // keys}".encode(), on_delivery=on_delivery)
                p.poll(0)
            left = p.flush(30)
            expect(left == 0 and not errors, f"idempotent produce: {left} undelivered, errors {errors[:3]}")
            s["detail"] = f"{n} delivered"

        with step(E, "transactional producer: init, commit 10 records, abort 1") as s:
            tp = Producer({**base, "transactional.id": f"fanout-smoke-{RUN}", "linger.ms": 5})
            t0 = time.perf_counter()
            tp.init_transactions(30)
            t_init = time.perf_counter() - t0
            tp.begin_transaction()
            for i in range(10):
                tp.produce(topic, key=f"t{i}".encode(), value=f"txn-committed-{i}".encode())
            tp.commit_transaction(30)
            tp.begin_transaction()
            tp.produce(topic, key=b"t-aborted", value=b"txn-ABORTED")
            tp.flush(30)
            tp.abort_transaction(30)
            s["detail"] = f"init_transactions {t_init:.3f}s"

        with step(E, "read_committed consumer reads the topic to its end") as s:
            c = Consumer({**base, "group.id": f"fanout-smoke-{RUN}", "auto.offset.reset": "earliest",
                          "isolation.level": "read_committed", "enable.partition.eof": True,
                          "enable.auto.commit": False})
            c.subscribe([topic])
            seen: list[tuple[str, str]] = []
            eof: set[int] = set()
            deadline = time.monotonic() + 60
            while len(eof) < partitions and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise SmokeFailure(f"consumer error: {m.error()}")
                seen.append((m.key().decode(), m.value().decode()))
            c.close()
            expect(len(eof) == partitions, f"read_committed consumer did not reach the end of all partitions in 60 s (saw {len(seen)})")
            values = [v for _, v in seen]
            expect(not any("ABORTED" in v for v in values), "read_committed consumer saw the aborted record")
            committed = sum(v.startswith("txn-committed-") for v in values)
            idem = [(k, v) for k, v in seen if v.startswith("idem-")]
            expect(committed == 10, f"expected the 10 committed transactional records, saw {committed}")
            expect(len(idem) == n, f"expected {n} idempotent records, saw {len(idem)}")
            per_key: dict[str, list[int]] = {}
            for k, v in idem:
                per_key.setdefault(k, []).append(int(v.split("-")[1]))
            expect(all(seq == sorted(seq) and len(seq) == len(set(seq)) for seq in per_key.values()),
                   "records of one key came back out of order or duplicated")
            s["detail"] = f"{len(seen)} records ({n} idempotent + {committed} committed), aborted one hidden, per-key order kept"
    finally:
        with step(E, f"delete topic {topic}"):
            for fut in admin.delete_topics([topic], operation_timeout=30).values():
                fut.result(timeout=30)


# ----------------------------------------------------------------------------------- Cassandra
def check_cassandra(url: str) -> None:
    import cassandra
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy
    from cassandra.query import BatchStatement, BatchType

    u = urlparse(url)
    expect(u.scheme == "cassandra" and u.hostname is not None and u.port is not None,
           f"FANOUT_VIEWS={url!r}: expected cassandra://HOST:PORT/KEYSPACE")
    keyspace = (u.path or "/fanout").strip("/") or "fanout"
    rf = int(parse_qs(u.query).get("replication_factor", ["1"])[0])
    E = "cassandra"
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=30)
    cluster = Cluster([u.hostname], port=u.port, connect_timeout=10,
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    try:
        with step(E, f"connect to {u.hostname}:{u.port}") as s:
            session = cluster.connect()
            rel = session.execute("SELECT release_version FROM system.local").one()[0]
            s["detail"] = (f"Cassandra {rel}, scylla-driver {cassandra.__version__}, protocol v{cluster.protocol_version}, "
                           f"{cluster.connection_class.__name__}")
        with step(E, f"create keyspace {keyspace} (SimpleStrategy, replication_factor {rf}) if missing") as s:
            session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                            f"{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}")
            have = session.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s", [keyspace]).one()
            s["detail"] = f"replication {dict(have[0])}"
        table = f"{keyspace}.smoke_{RUN}"
        with step(E, f"create table {table}"):
            session.execute(f"CREATE TABLE {table} (user_id text, conv text, seq bigint, body text, "
                            f"PRIMARY KEY ((user_id), conv, seq))")
        try:
            users, per_user = 10, 100
            ins = session.prepare(f"INSERT INTO {table} (user_id, conv, seq, body) VALUES (?, ?, ?, ?)")
            with step(E, f"{users} UNLOGGED batches of {per_user} rows (one partition each), in flight together") as s:
                futures = []
                for u_i in range(users):
                    b = BatchStatement(batch_type=BatchType.UNLOGGED)
                    for j in range(per_user):
                        b.add(ins, (f"u{u_i}", f"c{j % 3}", j, f"m{j}"))
                    futures.append(session.execute_async(b))
                for f in futures:
                    f.result()
                s["detail"] = f"{users * per_user} rows"
            with step(E, "select one partition and count all rows") as s:
                rows = list(session.execute(f"SELECT conv, seq, body FROM {table} WHERE user_id = %s", ["u3"]))
                expect(len(rows) == per_user, f"partition u3: expected {per_user} rows, got {len(rows)}")
                expect([(r.conv, r.seq) for r in rows] == sorted((r.conv, r.seq) for r in rows),
                       "rows of a partition not in clustering order")
                total = session.execute(f"SELECT count(*) FROM {table}").one()[0]
                expect(total == users * per_user, f"count(*) = {total}, expected {users * per_user}")
                s["detail"] = f"{len(rows)} rows in clustering order, count(*) = {total}"
        finally:
            with step(E, f"drop table {table}"):
                session.execute(f"DROP TABLE IF EXISTS {table}")
    finally:
        cluster.shutdown()


# ---------------------------------------------------------------------------------- PostgreSQL
def postgres_env(url: str) -> dict[str, str]:
    """FANOUT_EVENT_STORE=postgresql://USER[:PASSWORD]@HOST:PORT/DB -> eventsourcing.postgres settings."""
    u = urlparse(url)
    if u.scheme not in ("postgresql", "postgres") or not u.hostname or not u.path.strip("/"):
        raise SmokeFailure(f"FANOUT_EVENT_STORE={url!r}: expected postgresql://USER@HOST:PORT/DBNAME")
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_HOST": u.hostname,
        "POSTGRES_PORT": str(u.port or 5432),
        "POSTGRES_USER": unquote(u.username or "postgres"),
        "POSTGRES_PASSWORD": unquote(u.password or ""),  # must be set; empty is fine under trust auth
        "POSTGRES_DBNAME": u.path.strip("/"),
        "POSTGRES_CONNECT_TIMEOUT": "5",  # a wrong port/role/db otherwise shows only as a 30 s pool timeout
    }


def check_postgres(url: str) -> None:
    import eventsourcing
    import psycopg
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresSubscription

    E = "postgres"
    env = postgres_env(url)
    conninfo = (f"host={env['POSTGRES_HOST']} port={env['POSTGRES_PORT']} user={env['POSTGRES_USER']} "
                f"dbname={env['POSTGRES_DBNAME']} connect_timeout=5")
    if env["POSTGRES_PASSWORD"]:
        conninfo += f" password={env['POSTGRES_PASSWORD']}"
    with step(E, f"psycopg connect {env['POSTGRES_HOST']}:{env['POSTGRES_PORT']}/{env['POSTGRES_DBNAME']}") as s:
        try:
            with psycopg.connect(conninfo) as conn:
                ver = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        except psycopg.OperationalError as exc:
            raise SmokeFailure(f"cannot connect to {url}: {str(exc).strip()}") from None
        s["detail"] = f"PostgreSQL {ver}, psycopg {psycopg.__version__} ({psycopg.pq.__impl__})"

    class SmokeDog(Aggregate):
        def __init__(self, name: str) -> None:
            self.name = name
            self.tricks: list[str] = []

        @event("TrickAdded")
        def add_trick(self, trick: str) -> None:
            self.tricks.append(trick)

    class FanoutSmoke(Application[uuid.UUID]):
        name = f"FanoutSmoke{RUN}"  # tables fanoutsmoke<run>_events, dropped at the end

    app = FanoutSmoke(env=env)
    rec = app.recorder
    try:
        with step(E, "eventsourcing save + reload of an aggregate") as s:
            expect(isinstance(rec, PostgresApplicationRecorder), f"recorder is {type(rec).__name__}, not PostgresApplicationRecorder")
            dog = SmokeDog("Fido")
            dog.add_trick("roll over")
            app.save(dog)
            copy = app.repository.get(dog.id)
            expect(copy.tricks == ["roll over"] and copy.version == 2, f"reloaded {copy.tricks!r} v{copy.version}")
            s["detail"] = (f"eventsourcing {getattr(eventsourcing, '__version__', '9.5.6')}, "
                           f"{type(rec).__name__}, table {rec.events_table_name}, version {copy.version}")
        with step(E, "notification log: max_notification_id + select_notifications") as s:
            top = rec.max_notification_id()
            notes = rec.select_notifications(start=None, limit=10)
            expect(top == 2 and [n.id for n in notes] == [1, 2], f"max id {top}, ids {[n.id for n in notes]}")
            s["detail"] = f"ids {[n.id for n in notes]}"

        with step(E, "subscribe(gt=max id): LISTEN/NOTIFY wake-up after a save") as s:
            got: queue.Queue[Any] = queue.Queue()
            with rec.subscribe(gt=rec.max_notification_id()) as sub:
                expect(isinstance(sub, PostgresSubscription), f"subscription is {type(sub).__name__}")

                def consume() -> None:
                    try:
                        for n in sub:
                            got.put((time.perf_counter(), n))
                    except BaseException as exc:  # noqa: BLE001
                        got.put(exc)

                t = threading.Thread(target=consume, daemon=True)
                t.start()
                time.sleep(0.5)  # past the subscription's initial catch-up pull, so only a NOTIFY wakes it
                lat = []
                for i in range(3):
                    dog.add_trick(f"trick-{i}")
                    app.save(dog)
                    saved = time.perf_counter()
                    try:
                        item = got.get(timeout=10)
                    except queue.Empty:
                        raise SmokeFailure("subscription did not deliver a saved event within 10 s") from None
                    if isinstance(item, BaseException):
                        raise SmokeFailure(f"subscription failed: {item!r}")
                    lat.append(max(0.0, item[0] - saved))
                    time.sleep(0.2)
                sub.stop()
            t.join(5)
            s["detail"] = f"3 events delivered, wake-up after save() returned: {', '.join(f'{x * 1000:.1f} ms' for x in lat)}"
    finally:
        app.close()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{rec.events_table_name}"')


CHECKS: dict[str, tuple[str, Callable[[str], None]]] = {
    "postgres": ("FANOUT_EVENT_STORE", check_postgres),
    "kafka": ("FANOUT_LOG", check_kafka),
    "cassandra": ("FANOUT_VIEWS", check_cassandra),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(CHECKS), help="comma-separated subset of " + ",".join(CHECKS))
    ap.add_argument("--env-file", default=os.path.join(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines"), "engines.env"))
    args = ap.parse_args(argv)
    urls = load_urls(args.env_file)
    failed: list[str] = []
    t_all = time.perf_counter()
    for name in args.only.split(","):
        if name not in CHECKS:
            ap.error(f"unknown check {name!r}")
        key, fn = CHECKS[name]
        if key not in urls:
            out(name, f"FAIL: {key} is not set and not in {args.env_file} (run `make engines-up` first)")
            failed.append(name)
            continue
        out(name, f"{key}={urls[key]}")
        t0 = time.perf_counter()
        try:
            fn(urls[key])
        except SmokeFailure as exc:
            out(name, f"FAIL: {exc}")
            failed.append(name)
        except Exception as exc:  # noqa: BLE001 - any client error is a failed check, with its traceback
            traceback.print_exc()
            out(name, f"FAIL: {type(exc).__name__}: {exc}")
            failed.append(name)
        else:
            out(name, f"OK in {time.perf_counter() - t0:.2f}s")
    total = time.perf_counter() - t_all
    if failed:
        print(f"smoke: FAILED: {', '.join(failed)} ({total:.1f}s)", flush=True)
        return 1
    print(f"smoke: all {len(args.only.split(','))} checks passed ({total:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
