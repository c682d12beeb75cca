"""The views database's schema on SQLite (adapters/sqlite/views.py opens it): the tables
of the embedded runtime's views and the migration that brings a file written by an older
fanout up to VIEWS_SCHEMA_VERSION in place, as adapters/cassandra/schema.py holds the
keyspace's."""

from __future__ import annotations

import sqlite3

VIEWS_SCHEMA = """
CREATE TABLE IF NOT EXISTS tracking (
    projection TEXT NOT NULL, partition INTEGER NOT NULL, position INTEGER NOT NULL,
    PRIMARY KEY (projection, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS heads (
    tenant TEXT NOT NULL, conversation_id TEXT NOT NULL, aggregate_id TEXT NOT NULL,
    title TEXT, latest_conversation_seq INTEGER NOT NULL, last_activity_id TEXT,
    last_activity_at REAL, preview TEXT, member_count INTEGER NOT NULL, size_bucket TEXT NOT NULL,
    write_policy TEXT NOT NULL, broadcasts INTEGER NOT NULL, created_at REAL, position INTEGER NOT NULL,
    PRIMARY KEY (tenant, conversation_id)) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS heads_by_aggregate ON heads (aggregate_id);
CREATE TABLE IF NOT EXISTS messages (
    tenant TEXT NOT NULL, conversation_id TEXT NOT NULL, conversation_seq INTEGER NOT NULL,
    message_id TEXT NOT NULL, sender TEXT NOT NULL, text TEXT NOT NULL, mentions TEXT NOT NULL,
    mention_all INTEGER NOT NULL, reply_to_seq INTEGER, announcement INTEGER NOT NULL,
    sent_at REAL NOT NULL, pos INTEGER NOT NULL,
    PRIMARY KEY (tenant, conversation_id, conversation_seq));
CREATE TABLE IF NOT EXISTS states (
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
    read_conversation_seq INTEGER NOT NULL, joined_seq INTEGER NOT NULL, last_active REAL NOT NULL,
    delivered_conversation_seq INTEGER, skipping INTEGER NOT NULL, gap_end INTEGER, rebuilt_seq INTEGER NOT NULL,
    mention_seqs TEXT NOT NULL, broadcast_base INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id, conversation_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS states_by_conversation ON states (tenant, conversation_id);
CREATE TABLE IF NOT EXISTS delivery (
    tenant TEXT NOT NULL, conversation_id TEXT NOT NULL, conversation_seq INTEGER NOT NULL,
    message_id TEXT NOT NULL, write_policy TEXT NOT NULL, member_count INTEGER NOT NULL,
    mailbox_entries INTEGER NOT NULL, shards INTEGER NOT NULL, body_bytes INTEGER NOT NULL,
    pos INTEGER NOT NULL, online_pushes INTEGER, materialized_at REAL,
    PRIMARY KEY (tenant, conversation_id, conversation_seq));
CREATE TABLE IF NOT EXISTS reviews (review_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tiers (tier_id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS capacity (projection TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS log_positions (
    partition INTEGER PRIMARY KEY, position INTEGER NOT NULL, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS mailbox_written (
    partition INTEGER PRIMARY KEY, position INTEGER NOT NULL);
"""

# PRAGMA user_version of the views. 2: the states columns take the ADR's names
# (read_conversation_seq, delivered_conversation_seq). 3: tracking per (projection,
# partition); heads record the position of the last event applied to the conversation.
# Older files are brought up in place.
VIEWS_SCHEMA_VERSION = 3
_RENAMED_STATE_COLUMNS = {"read_seq": "read_conversation_seq", "delivered_seq": "delivered_conversation_seq"}


def migrate_views(con: sqlite3.Connection) -> None:
    """Create the views schema, or bring an older file up to VIEWS_SCHEMA_VERSION
    (each step idempotent, so a crash part-way is finished by the next open)."""
    version = con.execute("PRAGMA user_version").fetchone()[0]
    if version > VIEWS_SCHEMA_VERSION:
        raise RuntimeError(
            f"the views were written by a newer fanout (schema {version} > {VIEWS_SCHEMA_VERSION}): "
            "upgrade fanout, or delete them and run `fanout rebuild all`"
        )
    columns = {row[1] for row in con.execute("PRAGMA table_info(states)")}
    for old, new in _RENAMED_STATE_COLUMNS.items():
        if old in columns:
            con.execute(f"ALTER TABLE states RENAME COLUMN {old} TO {new}")
    heads = {row[1] for row in con.execute("PRAGMA table_info(heads)")}
    if heads and "position" not in heads:
        con.execute("ALTER TABLE heads ADD COLUMN position INTEGER NOT NULL DEFAULT 0")
    tracking = {row[1] for row in con.execute("PRAGMA table_info(tracking)")}
    if tracking and "partition" not in tracking:
        with con:
            con.execute("ALTER TABLE tracking RENAME TO tracking_v2")
            con.execute(
                "CREATE TABLE tracking (projection TEXT NOT NULL, partition INTEGER NOT NULL, "
                "position INTEGER NOT NULL, PRIMARY KEY (projection, partition)) WITHOUT ROWID"
            )
            con.execute("INSERT INTO tracking SELECT projection, 0, position FROM tracking_v2")
            con.execute("DROP TABLE tracking_v2")
    con.executescript(VIEWS_SCHEMA)
    con.execute(f"PRAGMA user_version = {VIEWS_SCHEMA_VERSION}")
