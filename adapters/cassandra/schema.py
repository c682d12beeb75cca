"""The keyspace and every table of the Cassandra views and mailbox, in one place: the DDL
(CQL with {ks} for the keyspace and {id} for the table id) and `create_schema`, which
makes them if absent. Layout, keys and numbers: docs/adr/0014-cassandra-data-model.md."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator, Sequence

from cassandra.cluster import Session

from adapters.cassandra.mailbox_floors import COPY as FLOORS
from adapters.cassandra.session_states import vouch
from projections.ports import StoreLayoutError

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
    # The login's copy of user_states (ADR-0043, session_states.py): a SessionState in one cell,
    # written with its user_states row in one mutation; read alone where `copies_complete` says so.
    """CREATE TABLE IF NOT EXISTS {ks}.session_states (tenant text, user_id text, conversation_id text,
    state blob, PRIMARY KEY ((tenant, user_id), conversation_id)) WITH ID = {id}""",
    """CREATE TABLE IF NOT EXISTS {ks}.copies_complete (copy text, PRIMARY KEY (copy)) WITH ID = {id}""",
    # A user's mailbox floor (ADR-0045, mailbox_floors.py): written with the user's state rows
    # (one partition key with user_states, one mutation); not rebuilt (no TARGET_TABLES entry:
    # the rebuild's merge restamps rows, and a floor's stamp is its own).
    """CREATE TABLE IF NOT EXISTS {ks}.mailbox_floors (tenant text, user_id text, above bigint,
    PRIMARY KEY ((tenant, user_id))) WITH ID = {id}""",
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
    # The session list's copy of the heads (ADR-0042): what a login shows of each head, in a
    # partition per (tenant, SessionHeadShard) so a login reads a user's heads from at most
    # SESSION_HEAD_SHARDS partitions (session_heads.py), not one per conversation. Written after `heads`, from the
    # same rows with the same stamps; a conversation it lacks is read from `heads`.
    """CREATE TABLE IF NOT EXISTS {ks}.session_heads (tenant text, shard int, conversation_id text,
    write_policy text, latest_conversation_seq bigint, broadcasts bigint, last_activity_id text,
    last_activity_at double, preview text,
    PRIMARY KEY ((tenant, shard), conversation_id)) WITH ID = {id}""",
    # where each log partition's views stand: the position and the next Kafka offset to read
    """CREATE TABLE IF NOT EXISTS {ks}.log_positions (partition int, position bigint, next_offset bigint,
    PRIMARY KEY (partition)) WITH ID = {id}""",
)

# The mailbox (ADR-0038, ADR-0050): a partition per (MailboxShard of the member, hour of the
# message), shared by every tenant, so a message to N members is at most PARTITION_SHARDS
# mutations inside Cassandra instead of N, and a unit of small messages of many tenants about
# one a partition it touches; `mailbox_hours` holds each tenant hour's last position, which a
# cursor read walks (adapters/cassandra/mailbox.py). An entry's conversation seq, flags and
# conversation are one cell, `ref` (ADR-0040: Cassandra's CPU an entry is paid per cell).
MAILBOX_TABLE = """
CREATE TABLE IF NOT EXISTS {ks}.mailbox (
    tenant text, shard int, hour bigint, user_id text, pos bigint,
    ref blob,
    PRIMARY KEY ((shard, hour), tenant, user_id, pos)
) WITH CLUSTERING ORDER BY (tenant ASC, user_id ASC, pos ASC) AND ID = {id}"""

MAILBOX_HOURS_TABLE = """
CREATE TABLE IF NOT EXISTS {ks}.mailbox_hours (
    tenant text, hour bigint, last_pos bigint,
    PRIMARY KEY ((tenant), hour)
) WITH CLUSTERING ORDER BY (hour ASC) AND ID = {id}"""

MAILBOX_TABLES: tuple[str, ...] = (MAILBOX_TABLE, MAILBOX_HOURS_TABLE)

ALL_TABLES: tuple[str, ...] = (*TABLES, *MAILBOX_TABLES)  # the views' tables and the mailbox's


# The tables each part of the views writes (the mailbox is a table of the keyspace here).
TARGET_TABLES: dict[str, tuple[str, ...]] = {
    "mailbox": ("mailbox", "mailbox_hours"),
    "state": ("conversation_states", "user_states", "login_index", "session_states"),
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
        "session_heads",
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


class OldMailboxLayout(StoreLayoutError):
    """The keyspace's mailbox table has a layout before this code's (ADR-0038, ADR-0040, ADR-0050)."""


# (what a layout before this code's lacks, what it was, the ADR that changed it), oldest first
_OLD_LAYOUTS = (
    ("shard", "before ADR-0038 (a partition per member)", "0038-mailbox-partitions-by-shard.md"),
    ("ref", "before ADR-0040 (an entry in three cells)", "0040-mailbox-entry-in-one-cell.md"),
    (
        "tenant clustering",
        "before ADR-0050 (a partition per tenant hour)",
        "0050-mailbox-partitions-shared-by-tenants.md",
    ),
)


def refuse_old_mailbox(session: Session, keyspace: str) -> None:
    """A keyspace made before ADR-0038 has a `mailbox` table keyed (tenant, user_id); one made
    before ADR-0040 has its entry in three cells, not in `ref`; one made before ADR-0050 has the
    tenant in the partition key: CREATE ... IF NOT EXISTS would keep it and every write would
    fail on its missing columns, or its entries would be read as absent. Refused with what to
    do instead."""
    rows = session.execute(
        "SELECT column_name, kind FROM system_schema.columns WHERE keyspace_name=%s AND table_name='mailbox'",
        (keyspace,),
    )
    columns = {
        (r["column_name"], r["kind"]) if isinstance(r, dict) else (r[0], r[1]) for r in rows
    }  # (name, kind): kind is partition_key, clustering or regular
    if not columns:
        return
    has = {name for name, _ in columns} | {f"{name} {kind}" for name, kind in columns}
    for lacks, layout, adr in _OLD_LAYOUTS:
        if lacks not in has:
            raise OldMailboxLayout(
                f"Cassandra keyspace {keyspace} holds the mailbox table of the layout {layout}. Point FANOUT_VIEWS "
                "at a new keyspace and let the workers build the views from the log (or `fanout rebuild all` "
                f"there), then drop this one: docs/adr/{adr}"
            )


def create_schema(session: Session, keyspace: str, replication: int, datacenter: str, tables: Sequence[str]) -> None:
    """The keyspace and `tables` if absent: idempotent, harmless when two processes race
    (IF NOT EXISTS and name-derived table ids); waits for schema agreement. Replication
    above 1 with a datacenter named: NetworkTopologyStrategy in that datacenter."""
    if datacenter and replication > 1:
        strategy = f"{{'class': 'NetworkTopologyStrategy', '{datacenter}': {replication}}}"
    else:
        strategy = f"{{'class': 'SimpleStrategy', 'replication_factor': {replication}}}"
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {strategy}", timeout=120)
    ddls = list(tables_by_name(tables))
    names = [name for name, _ in ddls]
    if "mailbox" in names:
        refuse_old_mailbox(session, keyspace)
    for name, ddl in ddls:
        session.execute(ddl.format(ks=keyspace, id=table_id(keyspace, name)), timeout=120)
    # Session.wait_for_schema_agreement reads schema_version as an attribute: with rows
    # as dicts it never agrees (scylla-driver 3.29); the control connection's check works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        agreed = session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)
    if not agreed:
        raise RuntimeError(f"Cassandra: no schema agreement on keyspace {keyspace} within 60 s")
    if {"user_states", "session_states", "copies_complete"} <= set(names) and not session.execute(
        f"SELECT user_id FROM {keyspace}.user_states LIMIT 1"
    ).one():
        vouch(session, keyspace)  # no user_states row lacks its copy (ADR-0043)
        if "mailbox_floors" in names:
            vouch(session, keyspace, FLOORS)  # nor its user's mailbox floor (ADR-0045)
