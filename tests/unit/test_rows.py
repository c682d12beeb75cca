"""The rows the views hold are typed once (projections/rows.py): the tables of every
backend have exactly those columns, so a column added to a row type and forgotten in a
table's DDL (or the other way round) fails here, not in a contract test on one engine."""

from __future__ import annotations

import re
import sqlite3

import pytest

from adapters.cassandra.schema import ALL_TABLES, TARGET_TABLES, tables_by_name
from adapters.sqlite.schema import migrate_views
from projections.rows import (
    DELIVERY_COLUMNS,
    DELIVERY_KEY,
    HEAD_COLUMNS,
    HEAD_KEY,
    MESSAGE_COLUMNS,
    MESSAGE_FIELDS,
    STATE_COLUMNS,
    delivery_dict,
    head_cells,
    head_dict,
    message_cells,
    message_dict,
)

ROWS = {
    "heads": (*HEAD_KEY, *HEAD_COLUMNS),
    "messages": ("tenant", *MESSAGE_COLUMNS),
    "delivery": (*DELIVERY_KEY, *DELIVERY_COLUMNS),
}


def sqlite_columns() -> dict[str, tuple[str, ...]]:
    con = sqlite3.connect(":memory:")
    migrate_views(con)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: tuple(r[1] for r in con.execute(f"PRAGMA table_info({t})")) for t in tables}


def cassandra_columns() -> dict[str, tuple[str, ...]]:
    out = {}
    for name, ddl in tables_by_name(ALL_TABLES):
        body = ddl.split("(", 1)[1].split("PRIMARY KEY")[0]
        body = body.replace("{_STATE_TYPES}", "")
        out[name] = tuple(m.group(1) for m in re.finditer(r"(\w+) (?:text|bigint|int|double|boolean|map<[^>]*>)", body))
    return out


@pytest.mark.parametrize("table", sorted(ROWS))
def test_the_sqlite_and_cassandra_tables_have_the_row_types_columns(table: str) -> None:
    assert sqlite_columns()[table] == ROWS[table]
    assert set(cassandra_columns()[table]) == set(ROWS[table])


def test_the_state_tables_have_the_state_columns() -> None:
    assert sqlite_columns()["states"] == ("tenant", "user_id", "conversation_id", *STATE_COLUMNS)
    for table in ("conversation_states", "user_states"):
        assert set(cassandra_columns()[table]) == {"tenant", "user_id", "conversation_id", *STATE_COLUMNS}


def test_every_table_a_rebuild_names_is_created() -> None:
    created = {name for name, _ in tables_by_name(ALL_TABLES)}
    assert {t for tables in TARGET_TABLES.values() for t in tables} <= created


def test_a_message_is_stored_and_answered_in_one_shape() -> None:
    m = {
        "conversation_id": "c",
        "conversation_seq": 3,
        "message_id": "m3",
        "sender": "a",
        "text": "hi @b",
        "mentions": ["b"],
        "mention_all": False,
        "reply_to_seq": None,
        "announcement": True,
        "sent_at": 1.5,
        "pos": 9,
    }
    stored = dict(zip(MESSAGE_COLUMNS, message_cells(m), strict=True))
    assert stored["mentions"] == '["b"]' and stored["pos"] == 9
    answered = message_dict({**stored, "mention_all": 0, "announcement": 1})  # as SQLite gives them back
    assert answered == {k: v for k, v in m.items() if k != "pos"} and tuple(answered) == MESSAGE_FIELDS
    assert message_dict(m) == answered  # as the memory store keeps it


def test_heads_and_delivery_records_are_answered_with_their_key() -> None:
    head = dict.fromkeys(HEAD_COLUMNS, 1) | {"aggregate_id": 7}
    assert head_cells(head)[0] == "7"
    assert tuple(head_dict({"tenant": "t", "conversation_id": "c", **head})) == (*HEAD_KEY, *HEAD_COLUMNS)
    record = {c: 0 for c in (*DELIVERY_KEY, *DELIVERY_COLUMNS)}
    assert tuple(delivery_dict({**record, "extra": 1})) == (*DELIVERY_KEY, *DELIVERY_COLUMNS)
