"""`fanout replay`: the event log as JSONL for analysts (SPEC section 6).

One line per event, in log order: position, type ("Conversation.MessageSent"),
originator_id, version, timestamp (UTC, when the event was recorded), tenant and
conversation_id where they apply, then the event's own attributes.

Reads the event store without the data-dir lock (it runs beside `fanout serve`):
it builds a FanoutApplication directly over the SQLite event store (or the PostgreSQL
one that FANOUT_EVENT_STORE=postgresql://... names: the distributed runtime) and pages
through `select_notifications`; nothing is written. The replay stops at the log
position it saw when it started.

Filters name things that must exist: an unknown event type, or a tenant or conversation
that is not in the log, is a ReplayError listing what there is (a typo is not "0 events").
Lines are strict JSON: a NaN or Infinity stored in the log stops the replay with an error
naming the event instead of writing a line no strict parser reads."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from uuid import UUID

from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic

from domain.conversation import Conversation
from domain.params import Parameters
from domain.quota import TenantQuota, TenantQuotaSlot
from domain.reads import READ_EVENTS, MemberReadState
from domain.review import Review, topics_of
from domain.tier import Tier
from fanout import strict_json
from fanout.config import EngineUnavailable, Settings
from projections.ports import ViewStore

PAGE = 1000
AGGREGATES: tuple[type[Aggregate], ...] = (Conversation, Review, Tier, TenantQuota, TenantQuotaSlot, MemberReadState)
# A member's reads are in a stream of its own that names its conversation (ADR-0018).
_READ_TOPICS = frozenset(topics_of(*READ_EVENTS))
SHOWN = 10  # names listed in an error before "(and N more)"
_BASE_FIELDS = set(Aggregate.Created.__dataclass_fields__)
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


def event_types() -> dict[str, type[Aggregate.Event]]:
    """Every event type the log can hold, by qualified name (Conversation.MessageSent)."""
    types: dict[str, type[Aggregate.Event]] = {}
    for aggregate in AGGREGATES:
        for name, value in vars(aggregate).items():
            if name == "Event" or not isinstance(value, type) or not issubclass(value, Aggregate.Event):
                continue
            if issubclass(value, Aggregate.Created) and not set(value.__dataclass_fields__) - _BASE_FIELDS:
                continue  # the empty Created eventsourcing adds when another event creates (Review.Opened)
            types[value.__qualname__] = value
    return dict(sorted(types.items()))


def listing(names: Iterable[str], shown: int = SHOWN) -> str:
    """`a, b, c (and 12 more)`, sorted; `none` when empty."""
    ordered = sorted(set(names))
    if not ordered:
        return "none"
    text = ", ".join(ordered[:shown])
    return text + (f" (and {len(ordered) - shown} more)" if len(ordered) > shown else "")


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_types(types: Iterable[str]) -> None:
    """Every name is an event type, qualified (Conversation.MessageSent) or short (MessageSent)."""
    known = event_types()
    short = {q.rsplit(".", 1)[-1] for q in known}
    unknown = sorted(t for t in set(types) if t not in known and t not in short)
    if unknown:
        hints = "".join(_did_you_mean(t, short | set(known)) for t in unknown)
        raise ReplayError(
            f"unknown event type {', '.join(repr(t) for t in unknown)}{hints}; "
            f"the event types are {listing(known, shown=len(known))}"
        )


def log_scopes(app: Any) -> dict[str, set[str]]:
    """tenant -> its conversation ids, from the creation events in the log (only those
    topics are read: a scan of the creation events, not of every message)."""
    topics = [get_topic(Conversation.Created), *topics_of(Review.Opened), get_topic(Tier.Created)]
    topics.extend([get_topic(TenantQuota.Created), get_topic(TenantQuotaSlot.Created)])
    scopes: dict[str, set[str]] = {}
    position = 1
    while True:
        notes = app.recorder.select_notifications(start=position, limit=PAGE, topics=topics, inclusive_of_start=True)
        if not notes:
            return scopes
        for note in notes:
            event = app.mapper.to_domain_event(note)
            tenant = getattr(event, "tenant", None)
            if isinstance(tenant, str):
                conversations = scopes.setdefault(tenant, set())
                if isinstance(event, Conversation.Created):
                    conversations.add(event.conversation_id)
        position = notes[-1].id + 1


def check_scope(app: Any, f: Filters) -> None:
    """--tenant and --conversation name a tenant / conversation that is in the log."""
    if f.tenant is None and f.conversation_id is None:
        return
    scopes = log_scopes(app)
    if f.tenant is not None and f.tenant not in scopes:
        raise ReplayError(
            f"no tenant {f.tenant!r} in the log{_did_you_mean(f.tenant, scopes)}; its tenants are {listing(scopes)}"
        )
    if f.conversation_id is None:
        return
    if f.tenant is not None:
        conversations, where = scopes[f.tenant], f" of tenant {f.tenant!r}"
    else:
        conversations, where = {c for cs in scopes.values() for c in cs}, ""
    if f.conversation_id not in conversations:
        raise ReplayError(
            f"no conversation {f.conversation_id!r}{where} in the log{_did_you_mean(f.conversation_id, conversations)}; "
            f"its conversations{where} are {listing(conversations)}"
        )


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
    streaming, else from the views (conversations) when the root gives cheap ones, else
    from the aggregate."""

    def __init__(self, app: Any, views: ViewStore | None) -> None:
        self.app = app
        self.known: dict[UUID, tuple[str | None, str | None]] = {}
        self._views = views

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
                key = self._views.conversation_key(oid)
            except Exception:  # not in the views (or unreadable): ask the aggregate
                key = (None, None)
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


def open_app(data_dir: Path, params: Parameters, settings: Settings | None = None) -> Any:
    """The application over the log the settings name (the data dir's SQLite store, or the
    PostgreSQL one of FANOUT_EVENT_STORE), as the composition root opens it: no table created."""
    from fanout.bootstrap import NoStore, open_application_for

    try:
        return open_application_for(_settings(data_dir, params, settings))
    except (NoStore, EngineUnavailable) as exc:
        raise ReplayError(str(exc)) from None


def _settings(data_dir: Path, params: Parameters, settings: Settings | None) -> Settings:
    """The command's settings over its data dir (the embedded engines over it when none)."""
    if settings is None:
        return Settings.embedded(data_dir, params)
    return replace(settings, data_dir=Path(data_dir), params=params)


def events(app: Any, views: ViewStore | None, f: Filters, progress: Any = None) -> Iterator[dict[str, Any]]:
    """The replay lines as dicts, filtered; conversation keys looked up in `views` when given
    (they are closed at the end)."""
    top = app.recorder.max_notification_id() or 0
    keys = _Keys(app, views)
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
                if (
                    only_originator is not None
                    and note.originator_id != only_originator
                    and note.topic not in _READ_TOPICS
                ):
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
    out: TextIO | Path,
    *,
    progress: bool = True,
    err: TextIO = sys.stderr,
    settings: Settings | None = None,
) -> int:
    """Write the JSONL lines to `out` (a stream, or a file opened once the filters are
    known to name things that exist); returns how many were written. `settings` naming
    the distributed engines: the log is read from PostgreSQL instead of the data dir."""
    check_types(filters.types)
    where = _settings(Path(data_dir), params, settings)
    app = open_app(Path(data_dir), params, settings)
    try:
        check_scope(app, filters)
        if isinstance(out, Path):
            with open(out, "w", encoding="utf-8") as stream:
                return _write(app, where, filters, stream, progress, err)
        return _write(app, where, filters, out, progress, err)
    finally:
        app.close()


def _write(app: Any, settings: Settings, filters: Filters, out: TextIO, progress: bool, err: TextIO) -> int:
    from tqdm import tqdm

    from fanout.bootstrap import open_lookup_views

    views = open_lookup_views(settings)  # the data dir's views read-only (beside a serve), or none

    top = app.recorder.max_notification_id() or 0
    total = max(0, top - max(1, filters.from_position) + 1)
    with tqdm(total=total, unit="ev", file=err, disable=not progress, desc="replay") as bar:
        n = 0
        for line in events(app, views, filters, bar.update):
            try:
                text = strict_json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
                text.encode("utf-8")  # a lone surrogate: no UTF-8 line can hold it
            except ValueError as exc:
                out.flush()
                raise ReplayError(
                    f"event at position {line['position']} ({line['type']}) cannot be written as strict JSON "
                    f"({exc}); {n} lines written before it"
                ) from None
            out.write(text)
            n += 1
    out.flush()
    return n
