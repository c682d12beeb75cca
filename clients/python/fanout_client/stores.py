"""Where a client keeps its state between runs: one small protocol, two stores (memory, a
SQLite file); an app can bring its own (IndexedDB, its own database) by writing the two
methods.

`save` gets what changed since the last save and must apply it in one transaction: the
mailbox cursor is only safe to store together with the held ranges of the entries it
passed (a cursor saved alone would skip them on the next run). Held ranges only grow, so
a save repeated after a crash is harmless."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Protocol

from fanout_client.core import Save
from fanout_client.state import ClientState, ConversationState


class StateStore(Protocol):
    def load(self) -> ClientState:
        """The stored state, or an empty one."""
        ...

    def save(self, change: Save) -> None:
        """Apply `change` (identity, cursor, changed conversations, removed ones) atomically."""
        ...


class MemoryStore:
    """Keeps the state as JSON in memory (a copy, as a file would): for tests and short-lived tools."""

    def __init__(self) -> None:
        self._meta: dict[str, object] = {"tenant": None, "user_id": None, "cursor": 0}
        self._conversations: dict[str, str] = {}

    def load(self) -> ClientState:
        state = ClientState(self._meta["tenant"], self._meta["user_id"], int(self._meta["cursor"]))  # type: ignore[arg-type, call-overload]
        for cid, text in self._conversations.items():
            state.conversations[cid] = ConversationState.from_json(json.loads(text))
        return state

    def save(self, change: Save) -> None:
        self._meta = {"tenant": change.tenant, "user_id": change.user_id, "cursor": change.cursor}
        for c in change.conversations:
            self._conversations[c.conversation_id] = json.dumps(c.to_json())
        for cid in change.removed:
            self._conversations.pop(cid, None)


class SqliteStore:
    """One SQLite file (WAL): a row per conversation and the identity and cursor."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
        "CREATE TABLE IF NOT EXISTS conversations (conversation_id TEXT PRIMARY KEY, state TEXT NOT NULL)",
    )

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        for statement in self.SCHEMA:
            self._db.execute(statement)

    def load(self) -> ClientState:
        meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        state = ClientState(meta.get("tenant"), meta.get("user_id"), int(meta.get("cursor", 0)))
        for (text,) in self._db.execute("SELECT state FROM conversations"):
            c = ConversationState.from_json(json.loads(text))
            state.conversations[c.conversation_id] = c
        return state

    def save(self, change: Save) -> None:
        meta = [("cursor", str(change.cursor))]
        meta += [(k, v) for k, v in (("tenant", change.tenant), ("user_id", change.user_id)) if v is not None]
        with self._db:  # one transaction
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta)
            self._db.executemany(
                "INSERT OR REPLACE INTO conversations (conversation_id, state) VALUES (?, ?)",
                [(c.conversation_id, json.dumps(c.to_json())) for c in change.conversations],
            )
            self._db.executemany("DELETE FROM conversations WHERE conversation_id = ?", [(c,) for c in change.removed])

    def close(self) -> None:
        self._db.close()
