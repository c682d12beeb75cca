"""`fanout replay`: the event log as JSONL for analysts (SPEC section 6).

One line per event, in log order: position, type ("Conversation.MessageSent"),
originator_id, version, timestamp (UTC, when the event was recorded), tenant and
conversation_id where they apply, then the event's own attributes.

Reads the event store without the data-dir lock (it runs beside `fanout serve`):
it builds a FanoutApplication directly over the SQLite event store and pages
through `select_notifications`; nothing is written. The replay stops at the log
position it saw when it started."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from uuid import UUID

from domain.conversation import Conversation
from domain.params import Parameters

PAGE = 1000
_SKIP = {"originator_id", "originator_version", "timestamp", "originator_topic"}


class ReplayError(RuntimeError):
    pass


@dataclass(frozen=True)
class Filters:
    since: datetime | None = None
    until: datetime | None = None
    conversation_id: str | None = None
    tenant: str | None = None
    types: frozenset[str] = frozenset()
    from_position: int = 1

    def type_matches(self, qualname: str) -> bool:
        # "MessageSent" or "Conversation.MessageSent"
        return not self.types or qualname in self.types or qualname.rsplit(".", 1)[-1] in self.types


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (naive means UTC) or seconds since the epoch."""
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO time (2026-08-14T09:00:00Z) nor epoch seconds") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _jsonable(v: Any) -> Any:
    if isinstance(v, UUID):
        return str(v)
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [_jsonable(x) for x in v]
    return v


class _Keys:
    """originator_id -> (tenant, conversation_id): from Created events seen while
    streaming, else from the views (conversations), else from the aggregate."""

    def __init__(self, app: Any, data_dir: Path) -> None:
        self.app = app
        self.known: dict[UUID, tuple[str | None, str | None]] = {}
        views = data_dir / "views.sqlite"
        self._views: sqlite3.Connection | None = None
        if views.exists():
            try:
                self._views = sqlite3.connect(f"file:{views}?mode=ro", uri=True, timeout=30)
            except sqlite3.Error:
                self._views = None

    def learn(self, event: Any) -> None:
        tenant = getattr(event, "tenant", None)
        if tenant is not None and event.originator_id not in self.known:
            cid = getattr(event, "conversation_id", None) if isinstance(event, Conversation.Created) else None
            self.known[event.originator_id] = (tenant, cid)

    def lookup(self, event: Any) -> tuple[str | None, str | None]:
        oid = event.originator_id
        if oid in self.known:
            return self.known[oid]
        key: tuple[str | None, str | None] = (None, None)
        if isinstance(event, Conversation.Event) and self._views is not None:
            try:
                row = self._views.execute(
                    "SELECT tenant, conversation_id FROM heads WHERE aggregate_id=?", (str(oid),)
                ).fetchone()
            except sqlite3.Error:
                row = None
            if row is not None:
                key = (row[0], row[1])
        if key == (None, None):
            try:
                agg = self.app.repository.get(oid)
                key = (
                    getattr(agg, "tenant", None),
                    getattr(agg, "conversation_id", None) if isinstance(agg, Conversation) else None,
                )
            except Exception:  # an aggregate we cannot load: leave the line unresolved
                key = (None, None)
        self.known[oid] = key
        return key

    def close(self) -> None:
        if self._views is not None:
            self._views.close()


def open_app(data_dir: Path, params: Parameters) -> Any:
    from fanout.application import FanoutApplication
    from fanout.runtime import event_store_env

    if not (data_dir / "events.sqlite").exists():
        raise ReplayError(f"{data_dir} has no event store (events.sqlite)")
    return FanoutApplication(params, {**event_store_env(data_dir), "CREATE_TABLE": "n"})


def events(app: Any, data_dir: Path, f: Filters, progress: Any = None) -> Iterator[dict[str, Any]]:
    """The replay lines as dicts, filtered."""
    top = app.recorder.max_notification_id() or 0
    keys = _Keys(app, data_dir)
    only_originator = Conversation.create_id(f.tenant, f.conversation_id) if f.tenant and f.conversation_id else None
    position = max(1, f.from_position)
    try:
        while position <= top:
            notes = app.recorder.select_notifications(start=position, limit=PAGE, stop=top, inclusive_of_start=True)
            if not notes:
                break
            if progress is not None:
                progress(len(notes))
            for note in notes:
                if only_originator is not None and note.originator_id != only_originator:
                    continue
                event = app.mapper.to_domain_event(note)
                keys.learn(event)
                line = _line(note.id, event, keys)
                if _keep(line, event, f):
                    yield line
            position = notes[-1].id + 1
    finally:
        keys.close()


def _line(position: int, event: Any, keys: _Keys) -> dict[str, Any]:
    qualname = type(event).__qualname__
    attrs = {k: v for k, v in vars(event).items() if k not in _SKIP}
    tenant, cid = keys.lookup(event)
    line: dict[str, Any] = {
        "position": position,
        "type": qualname,
        "originator_id": str(event.originator_id),
        "version": event.originator_version,
        "timestamp": event.timestamp.isoformat(),
    }
    if tenant is not None:
        line["tenant"] = tenant
    if cid is not None:
        line["conversation_id"] = cid
    for k, v in attrs.items():
        line.setdefault(k, _jsonable(v))
    return line


def _keep(line: dict[str, Any], event: Any, f: Filters) -> bool:
    if not f.type_matches(line["type"]):
        return False
    if f.tenant is not None and line.get("tenant") != f.tenant:
        return False
    if f.conversation_id is not None and line.get("conversation_id") != f.conversation_id:
        return False
    if f.since is not None and event.timestamp < f.since:
        return False
    return not (f.until is not None and event.timestamp > f.until)


def replay(
    data_dir: Path,
    params: Parameters,
    filters: Filters,
    out: TextIO,
    *,
    progress: bool = True,
    err: TextIO = sys.stderr,
) -> int:
    """Write the JSONL lines to `out`; returns how many were written."""
    from tqdm import tqdm

    app = open_app(Path(data_dir), params)
    try:
        top = app.recorder.max_notification_id() or 0
        total = max(0, top - max(1, filters.from_position) + 1)
        with tqdm(total=total, unit="ev", file=err, disable=not progress, desc="replay") as bar:
            n = 0
            for line in events(app, Path(data_dir), filters, bar.update):
                out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
                n += 1
        out.flush()
        return n
    finally:
        app.close()
