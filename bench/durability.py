"""The durability settings a bench ran under, read from the engines and stores themselves, so
that every number comes with what an acknowledged write would survive (docs/PERFORMANCE.md,
"What each runtime survives"). Each bench of the headline set (bench/headline.py) prints one
of these reports before it measures:

* `distributed(urls)`: PostgreSQL's `fsync`, `synchronous_commit`, `full_page_writes` and
  `wal_sync_method` (SHOW); the event topic's replication (the replicas of its partitions in
  the broker's metadata), `min.insync.replicas`, `flush.messages` and `flush.ms`, and the
  broker's `log.flush.interval.messages` / `.ms` (the admin client's describe_configs);
  Cassandra's `commitlog_sync`, its window or period, `commitlog_disk_access_mode` and
  `concurrent_writes` (`system_views.settings`), the keyspace's replication
  (`system_schema.keyspaces`) and the consistency level the processes use (the views URL).
* `embedded()`: the embedded runtime's stores opened in a scratch data dir the way the runtime
  opens them: the event store's SQLite connection (eventsourcing's, through
  `open_application`) and the views' (`adapters/sqlite/connect.py`), each asked for
  `PRAGMA journal_mode` and `PRAGMA synchronous` (a per-connection setting: a second
  connection to a running serve's file would not show the serve's); the mailbox's RocksDB
  write options as the adapter sets them (`adapters/rocksdb/mailbox.py` SYNC_WRITES).

The last line of a report starts with "durability:" and is the short form the headline table
shows. Not a bench itself: `.venv/bin/python bench/durability.py` prints both reports (the
distributed one for the engines of $FANOUT_ENGINES_DIR/engines.env, their `fanout` names)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
LONG_MAX = 9223372036854775807  # Kafka's "never" for the flush settings
CASSANDRA_SETTINGS = (
    "commitlog_sync",
    "commitlog_sync_group_window",
    "commitlog_sync_period",
    "commitlog_disk_access_mode",
    "concurrent_writes",
)


def _sqlite_pragmas(cursor: Any) -> tuple[str, str]:
    """journal_mode and synchronous of a connection (sqlite3's, whose execute returns a cursor,
    or eventsourcing's cursor, whose execute returns None)."""

    def pragma(name: str) -> Any:
        result = cursor.execute(f"PRAGMA {name}")
        return (cursor if result is None else result).fetchone()[0]

    level = int(pragma("synchronous"))
    return str(pragma("journal_mode")), f"{level} ({SYNCHRONOUS.get(level, '?')})"


def embedded() -> str:
    """The embedded runtime's stores as its adapters open them (a scratch data dir)."""
    from adapters.rocksdb import mailbox as rocks
    from adapters.sqlite.connect import connect
    from domain.params import Parameters
    from fanout.bootstrap import open_application

    scratch = Path(tempfile.mkdtemp(prefix="fanout-durability-"))
    try:
        app = open_application(Parameters(), scratch)
        try:
            with app.recorder.datastore.transaction(commit=False) as cursor:
                events_journal, events_sync = _sqlite_pragmas(cursor)
        finally:
            app.close()
        con = connect(scratch / "views.sqlite")
        try:
            views_journal, views_sync = _sqlite_pragmas(con)
        finally:
            con.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    sync = rocks.SYNC_WRITES
    lines = [
        "durability in force (bench/durability.py; the embedded runtime's stores opened as it opens them):",
        f"  event store (eventsourcing's SQLite): journal_mode={events_journal} synchronous={events_sync}",
        f"  views (SQLite, adapters/sqlite/connect.py): journal_mode={views_journal} synchronous={views_sync}",
        f"  mailbox (RocksDB, adapters/rocksdb/mailbox.py): write-ahead log on, WriteOptions.sync={sync}",
        f"durability: event store SQLite synchronous={events_sync.split()[1].strip('()')}; views SQLite "
        f"synchronous={views_sync.split()[1].strip('()')}; mailbox RocksDB {'fsync a batch' if sync else 'no fsync'}",
    ]
    return "\n".join(lines)


def _postgres(url: str) -> dict[str, str]:
    import psycopg

    from tools.deploy import with_url

    # the server's settings, asked of its `postgres` database (the bench's may not exist yet)
    with psycopg.connect(with_url(url, path="postgres"), connect_timeout=5) as conn:
        return {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")
        }


def _kafka(url: str) -> tuple[str, str]:
    from confluent_kafka.admin import AdminClient, ConfigResource

    from fanout.urls import kafka_settings

    k = kafka_settings(url)
    admin = AdminClient({"bootstrap.servers": k.brokers})
    meta = admin.list_topics(timeout=10)
    broker = ConfigResource(ConfigResource.Type.BROKER, str(min(meta.brokers)))
    wanted = [broker]
    topic = meta.topics.get(k.topic)
    if topic is not None and topic.error is None:
        wanted.append(ConfigResource(ConfigResource.Type.TOPIC, k.topic))
    configs = {res.restype: f.result(timeout=10) for res, f in admin.describe_configs(wanted).items()}

    def value(kind: object, name: str) -> str:
        entry = configs.get(kind, {}).get(name)
        if entry is None or entry.value is None:
            return "unset"
        return "never (Long.MAX)" if entry.value == str(LONG_MAX) else str(entry.value)

    b = ConfigResource.Type.BROKER
    flush = (f"broker log.flush.interval.messages={value(b, 'log.flush.interval.messages')} "
             f"log.flush.interval.ms={value(b, 'log.flush.interval.ms')}")  # fmt: skip
    broker_flush = value(b, "log.flush.interval.messages")
    if topic is None or topic.error is not None:
        replication = f"topic {k.topic} not created yet: the processes create it with replication {k.replication}"
        short = f"RF {k.replication} (its URL)"
    else:
        t = ConfigResource.Type.TOPIC
        factors = "/".join(map(str, sorted({len(p.replicas) for p in topic.partitions.values()})))
        replication = (f"topic {k.topic}: {len(topic.partitions)} partitions, replication {factors}, "
                       f"min.insync.replicas={value(t, 'min.insync.replicas')}, "
                       f"flush.messages={value(t, 'flush.messages')} flush.ms={value(t, 'flush.ms')}")  # fmt: skip
        short = f"RF {factors}"
        broker_flush = value(t, "flush.messages")  # the topic's, the broker's unless set on the topic
    short += ", no flush (page cache)" if broker_flush.startswith("never") else f", flush every {broker_flush} messages"
    return f"{replication}; {flush}; {len(meta.brokers)} broker(s)", short


def _cassandra(url: str) -> tuple[str, str]:
    from adapters.cassandra.connect import open_cluster
    from fanout.urls import cassandra_settings

    c = cassandra_settings(url)
    cluster, session = open_cluster(c.hosts, c.port, c.datacenter, c.consistency)
    try:
        names = ", ".join(f"'{name}'" for name in CASSANDRA_SETTINGS)
        rows = session.execute(f"SELECT name, value FROM system_views.settings WHERE name IN ({names})")
        got = {str(r["name"] if isinstance(r, dict) else r[0]): str(r["value"] if isinstance(r, dict) else r[1])
               for r in rows}  # fmt: skip
        ks = session.execute(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name=%s", (c.keyspace,)
        ).one()
    finally:
        cluster.shutdown()
    replication = (ks["replication"] if isinstance(ks, dict) else ks[0]) if ks is not None else None
    if replication is None:
        ks_line = (
            f"keyspace {c.keyspace} not created yet: the first replica creates it with replication {c.replication}"
        )
        rf = str(c.replication)
    else:
        ks_line = f"keyspace {c.keyspace}: {dict(replication)}"
        rf = "/".join(v for k, v in sorted(dict(replication).items()) if k != "class")
    mode = got.get("commitlog_sync", "?")
    window = {"group": "commitlog_sync_group_window", "periodic": "commitlog_sync_period"}.get(mode)
    detail = " ".join(f"{name}={got.get(name, '?')}" for name in CASSANDRA_SETTINGS if name != "commitlog_sync")
    line = f"commitlog_sync={mode} {detail}; {ks_line}; reads and writes at {c.consistency}"
    short = f"commit log {mode}{f' {got.get(window)}' if window else ''}, {got.get('commitlog_disk_access_mode', '?')}" \
            f" I/O, RF {rf}"  # fmt: skip
    return line, short


def distributed(urls: Mapping[str, str]) -> str:
    """The engines the URLs name (a bench's namespace: its topic and keyspace, once created)."""
    pg = _postgres(urls["FANOUT_EVENT_STORE"])
    kafka, kafka_short = _kafka(urls["FANOUT_LOG"])
    cassandra, cassandra_short = _cassandra(urls["FANOUT_VIEWS"])
    lines = [
        "durability in force (bench/durability.py; read from the engines):",
        "  PostgreSQL (event store): " + " ".join(f"{k}={v}" for k, v in pg.items()),
        f"  Kafka (log): {kafka}",
        f"  Cassandra (views, mailbox): {cassandra}",
        f"durability: PostgreSQL fsync={pg['fsync']} synchronous_commit={pg['synchronous_commit']}; "
        f"Kafka {kafka_short}; Cassandra {cassandra_short}",
    ]
    return "\n".join(lines)


def main() -> int:
    print(embedded())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from distributed_common import env_file

    print(distributed(env_file()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
