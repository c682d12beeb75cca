"""infra/cluster/check.py KAFKA_URL CASSANDRA_URL: is the three-node cluster really replicating?

Cassandra: the driver sees every contact point up; a keyspace with RF 3 takes a write and a read
at consistency ALL (so every replica answered), then is dropped. Kafka: every broker is in the
metadata; a topic with 3 replicas and min.insync.replicas=2 has all three replicas in sync on
every partition, then is deleted. Exit 0 when both hold within the timeout, 1 otherwise."""

from __future__ import annotations

import sys
import time
import uuid

from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster
from cassandra.query import SimpleStatement
from confluent_kafka.admin import AdminClient, NewTopic

from fanout.urls import cassandra_settings, kafka_settings

TIMEOUT = 120.0


def check_cassandra(url: str) -> None:
    s = cassandra_settings(url)
    t0 = time.monotonic()
    cluster = Cluster(list(s.hosts), port=s.port, protocol_version=5)
    try:
        session = cluster.connect()
        while len([h for h in cluster.metadata.all_hosts() if h.is_up]) < len(s.hosts):
            if time.monotonic() - t0 > TIMEOUT:
                raise SystemExit(f"cassandra: hosts up: {[str(h) for h in cluster.metadata.all_hosts() if h.is_up]}")
            time.sleep(0.5)
        ks = f"ring_check_{uuid.uuid4().hex[:8]}"
        session.execute(
            f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'NetworkTopologyStrategy', '{s.datacenter}': 3}}",
            timeout=120,
        )
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)", timeout=120)
        while True:
            try:
                session.execute(SimpleStatement(f"INSERT INTO {ks}.t (k, v) VALUES (1, 1)", consistency_level=ConsistencyLevel.ALL))
                row = session.execute(SimpleStatement(f"SELECT v FROM {ks}.t WHERE k = 1", consistency_level=ConsistencyLevel.ALL)).one()
                assert row is not None and row.v == 1
                break
            except Exception as exc:  # a node still learning the schema: retry until the timeout
                if time.monotonic() - t0 > TIMEOUT:
                    raise SystemExit(f"cassandra: write/read at ALL failed: {exc!r}") from None
                time.sleep(0.5)
        session.execute(f"DROP KEYSPACE {ks}", timeout=120)
        print(f"cluster-check: cassandra: {len(s.hosts)} nodes up, write+read at ALL with RF 3 in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    finally:
        cluster.shutdown()


def check_kafka(url: str) -> None:
    k = kafka_settings(url)
    t0 = time.monotonic()
    admin = AdminClient({"bootstrap.servers": k.brokers})
    want = len(k.brokers.split(","))
    while len(admin.list_topics(timeout=10).brokers) < want:
        if time.monotonic() - t0 > TIMEOUT:
            raise SystemExit(f"kafka: brokers {admin.list_topics(timeout=10).brokers}")
        time.sleep(0.5)
    topic = f"cluster-check-{uuid.uuid4().hex[:8]}"
    new = NewTopic(topic, num_partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(60)
    while True:
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and t.partitions and all(len(p.isrs) == 3 and p.leader >= 0 for p in t.partitions.values()):
            break
        if time.monotonic() - t0 > TIMEOUT:
            raise SystemExit(f"kafka: ISRs not complete: {t and {i: p.isrs for i, p in t.partitions.items()}}")
        time.sleep(0.3)
    admin.delete_topics([topic])[topic].result(60)
    print(f"cluster-check: kafka: {want} brokers, a topic with 3 in-sync replicas in {time.monotonic() - t0:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    check_kafka(sys.argv[1])
    check_cassandra(sys.argv[2])
