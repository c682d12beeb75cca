"""The keyspace and every table of the Cassandra views and mailbox, in one place: the DDL
(CQL with {ks} for the keyspace and {id} for the table id) and `create_schema`, which
makes them if absent. Layout, keys and numbers: docs/adr/0014-cassandra-data-model.md."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator, Sequence

from cassandra.cluster import Session

_STATE_TYPES = """read_conversation_seq bigint, joined_seq bigint, last_active double,
    delivered_conversation_seq bigint, skipping int, gap_end bigint, rebuilt_seq bigint,
    mention_seqs text, broadcast_base bigint"""

TABLES: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS {ks}.tracking (projection text, partition int, position bigint,
    PRIMARY KEY ((projection), partition)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.heads (tenant text, conversation_id text, aggregate_id text, title text,
    latest_conversation_seq bigint, last_activity_id text, last_activity_at double, preview text,
    member_count bigint, size_bucket text, write_policy text, broadcasts bigint, created_at double, position bigint,
    PRIMARY KEY ((tenant, conversation_id))) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.heads_by_aggregate (aggregate_id text, tenant text, conversation_id text,
    PRIMARY KEY (aggregate_id)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.heads_by_tenant (tenant text, conversation_id text, size_bucket text,
    PRIMARY KEY ((tenant), conversation_id)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.messages (tenant text, conversation_id text, conversation_seq bigint,
    message_id text, sender text, text text, mentions text, mention_all boolean, reply_to_seq bigint,
    announcement boolean, sent_at double, pos bigint,
    PRIMARY KEY ((tenant, conversation_id), conversation_seq)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.broadcasts (tenant text, conversation_id text, conversation_seq bigint,
    PRIMARY KEY ((tenant, conversation_id), conversation_seq)) WITH ID = {id}""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.conversation_states (tenant text, conversation_id text, user_id text,
    {_STATE_TYPES}, PRIMARY KEY ((tenant, conversation_id), user_id)) WITH ID = {{id}}""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.user_states (tenant text, user_id text, conversation_id text,
    {_STATE_TYPES}, PRIMARY KEY ((tenant, user_id), conversation_id)) WITH ID = {{id}}""",
    """CREATE TABLE IF NOT EXISTS {ks}.delivery (tenant text, conversation_id text, conversation_seq bigint,
    message_id text, write_policy text, member_count bigint, mailbox_entries bigint, shards int, body_bytes bigint,
    pos bigint, online_pushes bigint, materialized_at double,
    PRIMARY KEY ((tenant, conversation_id), conversation_seq)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.reviews (review_id text, tenant text, body text, written bigint,
    PRIMARY KEY (review_id)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.reviews_by_tenant (tenant text, review_id text, body text, written bigint,
    PRIMARY KEY ((tenant), review_id)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.tiers (tier_id text, body map<text, text>,
    PRIMARY KEY (tier_id)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.capacity (projection text, body text,
    PRIMARY KEY (projection)) WITH ID = {id}""",
    # online pushes: one row per replica that pushed the message (summed on read: exact across replicas)
    """CREATE TABLE IF NOT EXISTS {ks}.delivery_pushes (tenant text, conversation_id text, conversation_seq bigint,
    pusher text, pushes bigint,
    PRIMARY KEY ((tenant, conversation_id), conversation_seq, pusher)) WITH ID = {id}""",
    # the login index (ADR-0028): a member's row of each conversation, in the hour of its last activity
    """CREATE TABLE IF NOT EXISTS {ks}.login_index (tenant text, user_id text, bucket bigint, conversation_id text,
    PRIMARY KEY ((tenant, user_id), bucket, conversation_id))
    WITH CLUSTERING ORDER BY (bucket DESC, conversation_id ASC) AND ID = {id}""",
    # where each log partition's views stand: the position and the next Kafka offset to read
    """CREATE TABLE IF NOT EXISTS {ks}.log_positions (partition int, position bigint, next_offset bigint,
    PRIMARY KEY (partition)) WITH ID = {id}""",
)

MAILBOX_TABLE = """
CREATE TABLE IF NOT EXISTS {ks}.mailbox (
    tenant text, user_id text, pos bigint,
    conversation_seq bigint, conversation_id text, flags int,
    PRIMARY KEY ((tenant, user_id), pos)
) WITH CLUSTERING ORDER BY (pos ASC) AND ID = {id}"""

ALL_TABLES: tuple[str, ...] = (*TABLES, MAILBOX_TABLE)  # the views' tables and the mailbox's


# The tables each part of the views writes (the mailbox is a table of the keyspace here).
TARGET_TABLES: dict[str, tuple[str, ...]] = {
    "mailbox": ("mailbox",),
    "state": ("conversation_states", "user_states", "login_index"),
    "heads": (
        "heads",
        "heads_by_aggregate",
        "heads_by_tenant",
        "messages",
        "broadcasts",
        "delivery",
        "reviews",
        "reviews_by_tenant",
        "tiers",
    ),
}


def table_id(keyspace: str, table: str) -> uuid.UUID:
    """A table id derived from its name: two processes creating the same table at once
    (CREATE ... IF NOT EXISTS on two coordinators) create the same table, not two."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"fanout/{keyspace}/{table}")


def tables_by_name(tables: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(table name, DDL) of each DDL statement."""
    for ddl in tables:
        yield ddl.split("(", 1)[0].split()[-1].split(".")[-1], ddl


def create_schema(session: Session, keyspace: str, replication: int, datacenter: str, tables: Sequence[str]) -> None:
    """The keyspace and `tables` if absent: idempotent, harmless when two processes race
    (IF NOT EXISTS and name-derived table ids); waits for schema agreement. Replication
    above 1 with a datacenter named: NetworkTopologyStrategy in that datacenter."""
    if datacenter and replication > 1:
        strategy = f"{{'class': 'NetworkTopologyStrategy', '{datacenter}': {replication}}}"
    else:
        strategy = f"{{'class': 'SimpleStrategy', 'replication_factor': {replication}}}"
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {strategy}", timeout=120)
    for name, ddl in tables_by_name(tables):
        session.execute(ddl.format(ks=keyspace, id=table_id(keyspace, name)), timeout=120)
    # Session.wait_for_schema_agreement reads schema_version as an attribute: with rows
    # as dicts it never agrees (scylla-driver 3.29); the control connection's check works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        agreed = session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)
    if not agreed:
        raise RuntimeError(f"Cassandra: no schema agreement on keyspace {keyspace} within 60 s")
