"""The three-node cluster's URLs (ADR-0027) parse into what the clients take."""

from __future__ import annotations

import pytest

from fanout.urls import UrlError, cassandra_settings, kafka_settings

KAFKA = "kafka://127.0.0.2:29092,127.0.0.3:29092,127.0.0.4:29092?partitions=6&replication=3&min_insync=2"
VIEWS = "cassandra://127.0.0.2:29042,127.0.0.3:29042,127.0.0.4:29042/fanout?replication=3&consistency=LOCAL_QUORUM&in_flight=24"


def test_kafka_cluster_url() -> None:
    k = kafka_settings(KAFKA)
    assert k.brokers == "127.0.0.2:29092,127.0.0.3:29092,127.0.0.4:29092"
    assert (k.partitions, k.replication, k.min_insync) == (6, 3, 2)
    assert kafka_settings("kafka://127.0.0.1:19092").min_insync == 0  # the broker's default


def test_min_insync_above_replication_is_refused() -> None:
    with pytest.raises(UrlError, match="min_insync=3 is more than replication"):
        kafka_settings("kafka://h:1?replication=2&min_insync=3")
    with pytest.raises(UrlError, match="min_insync"):
        kafka_settings("kafka://h:1?replication=3&min_insync=0")


def test_cassandra_cluster_url_names_every_contact_point() -> None:
    c = cassandra_settings(VIEWS)
    assert c.hosts == ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    assert (c.port, c.keyspace, c.replication, c.consistency, c.in_flight) == (29042, "fanout", 3, "LOCAL_QUORUM", 24)
    assert cassandra_settings("cassandra://127.0.0.1:19042/ks").in_flight == 200


def test_the_protocol_compression_is_lz4_or_none_and_nothing_else() -> None:
    assert cassandra_settings("cassandra://127.0.0.1:19042/ks").compression == "lz4"
    assert cassandra_settings("cassandra://127.0.0.1:19042/ks?compression=none").compression == "none"
    with pytest.raises(UrlError, match="compression='snappy'; one of lz4, none"):
        cassandra_settings("cassandra://127.0.0.1:19042/ks?compression=snappy")
