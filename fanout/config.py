"""Settings (SPEC section 8): every parameter from FANOUT_<NAME>, or a TOML config
file with the same names. A bad value stops start-up with a message naming it.

One `Settings` for every process kind (`fanout serve` and the tools, `fanout worker`,
`fanout relay`): the engines, the ADR parameters, and the worker's and the relay's command-line
knobs (`WorkerOptions`, `RelayOptions`: their defaults are written here only; the commands'
flags default to them). Each composition root (`fanout/bootstrap/`) takes it whole."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from domain.params import Parameters, Rate
from fanout import urls


class ConfigError(ValueError):
    pass


class EngineUnavailable(RuntimeError):
    """An engine the settings name cannot be used at start-up (a missing database, a server
    that does not answer): the operator can fix it; the commands print it as one line."""


class ProcessFailed(RuntimeError):
    """A process that started cannot go on (the relay fenced by a newer one, Kafka refusing
    its transactions): one line, exit 1 (cli/exits.py)."""


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
MAX_CLOCK_SKEW_CEILING = 1800.0  # FANOUT_MAX_CLOCK_SKEW's largest value: two replicas at most an hour apart


# Variables of the project's tooling, not settings of a fanout process: the engine scripts
# (infra/engines: FANOUT_ENGINES, FANOUT_ENGINES_DIR, ...), the test suite's knobs
# (FANOUT_TESTS_WITHOUT_ENGINES of `make test-fast`, which the processes the tests start
# inherit) and its fault-injection points (projections/failpoints.py).
TOOLING_PREFIXES = ("FANOUT_ENGINES", "FANOUT_INVARIANT_", "FANOUT_TESTS_", "FANOUT_FAILPOINTS")


def parse_duration(text: str) -> float:
    """'500ms', '2s', '24h', '7d' -> seconds; a bare number is seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d)?\s*", str(text))
    if not m:
        raise ValueError(f"{text!r} is not a duration like 500ms, 2s, 24h or 7d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parse_rate(text: str) -> Rate:
    """'1/3s' -> 1 per 3 seconds; '20/s' or '20' -> 20 per second."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?\s*(?:ms|s|min|m|h|d)?|s|m|h|d))?\s*", str(text))
    if not m:
        raise ValueError(f"{text!r} is not a rate like 1/3s or 20/s")
    per = m.group(2) or "1s"
    if per in _UNITS:
        per = "1" + per
    seconds = parse_duration(per)
    if seconds <= 0 or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r}: a rate needs a positive count and period")
    return Rate(float(m.group(1)), seconds)


def parse_bucket_rates(text: str) -> tuple[float, float, float]:
    """'20/5/2' or '20,5,2' msg/s for small / medium / large."""
    parts = re.split(r"[/,]", str(text))
    if len(parts) != 3:
        raise ValueError(f"{text!r}: give three rates small/medium/large, e.g. 20/5/2")
    values = tuple(float(p) for p in parts)
    if any(v <= 0 for v in values):
        raise ValueError(f"{text!r}: rates must be positive")
    return values  # type: ignore[return-value]


def _positive_int(text: str) -> int:
    v = int(str(text).replace("_", ""))
    if v <= 0:
        raise ValueError("must be a positive integer")
    return v


def _positive_float(text: str) -> float:
    v = float(str(text).replace("_", ""))
    if v <= 0:
        raise ValueError("must be positive")
    return v


def _at_least_one(text: str) -> float:
    v = float(str(text).replace("_", ""))
    if v < 1:
        raise ValueError("must be at least 1 (one command)")
    return v


def _clock_skew(text: str) -> float:
    v = parse_duration(text)
    if v > MAX_CLOCK_SKEW_CEILING:
        raise ValueError(
            f"at most {MAX_CLOCK_SKEW_CEILING:.0f}s: the views' cursor reads tolerate replicas an hour apart (ADR-0041)"
        )
    return v


def _ratio(text: str) -> float:
    v = float(text)
    if not 0 < v <= 1:
        raise ValueError("must be in (0, 1]")
    return v


# name (without FANOUT_) -> (parser, how it lands in Parameters)
_PARAMS: dict[str, tuple[Callable[[str], Any], Callable[[Any], dict[str, Any]]]] = {
    "MAX_GROUP_MEMBERS": (_positive_int, lambda v: {"max_group_members": v}),
    "SMALL_MAX_MEMBERS": (_positive_int, lambda v: {"small_max_members": v}),
    "MEDIUM_MAX_MEMBERS": (_positive_int, lambda v: {"medium_max_members": v}),
    "PER_CONVERSATION_MSG_RATE": (
        parse_bucket_rates,
        lambda v: {"rate_small": v[0], "rate_medium": v[1], "rate_large": v[2]},
    ),
    "PER_SENDER_IN_CONVERSATION_RATE": (parse_rate, lambda v: {"per_sender_in_conversation_rate": v}),
    "TENANT_FANOUT_QUOTA_CAPACITY": (_positive_float, lambda v: {"tenant_fanout_quota_capacity": v}),
    "TENANT_FANOUT_QUOTA_REFILL": (_positive_float, lambda v: {"tenant_fanout_quota_refill_per_sec": v}),
    "PLATFORM_FANOUT_BUDGET": (_positive_float, lambda v: {"platform_fanout_budget": v}),
    "T1_RATIO": (_ratio, lambda v: {"t1_ratio": v}),
    "MAILBOX_WRITE_BUDGET": (_positive_float, lambda v: {"mailbox_write_budget": v}),
    "T2_RATIO": (_ratio, lambda v: {"t2_ratio": v}),
    "CAPACITY_WINDOW": (parse_duration, lambda v: {"capacity_window": v}),
    "ACTIVITY_WINDOW": (parse_duration, lambda v: {"activity_window": v}),
    "POLICY_SWITCH_EXIT_RATIO": (_ratio, lambda v: {"policy_switch_exit_ratio": v}),
    "POLICY_SWITCH_MIN_INTERVAL": (parse_duration, lambda v: {"policy_switch_min_interval": v}),
    "MAILBOX_SHARDS": (_positive_int, lambda v: {"mailbox_shards": v}),
    "MAX_TEXT_LENGTH": (_positive_int, lambda v: {"max_text_length": v}),
    "PER_USER_COMMAND_RATE": (parse_rate, lambda v: {"per_user_command_rate": v}),
    "PER_USER_COMMAND_BURST": (_at_least_one, lambda v: {"per_user_command_burst": v}),
    "FRESH_READ_TIMEOUT": (parse_duration, lambda v: {"fresh_read_timeout": v}),
    "MAX_PROJECTION_LAG_EVENTS": (_positive_int, lambda v: {"max_projection_lag_events": v}),
    "MAX_PROJECTION_LAG_ENTRIES": (_positive_int, lambda v: {"max_projection_lag_entries": v}),
    "MAX_CONNECTIONS": (_positive_int, lambda v: {"max_connections": v}),
    "MAX_CLOCK_SKEW": (_clock_skew, lambda v: {"max_clock_skew": v}),
    "REREVIEW_HOLD": (parse_duration, lambda v: {"rereview_hold": v}),
    "MAILBOX_UNIT_COST_ESTIMATE_US": (_positive_float, lambda v: {"mailbox_unit_cost_estimate_us": v}),
    "REREVIEW_ALPHA_MAX": (_ratio, lambda v: {"rereview_alpha_max": v}),
}


@dataclass(frozen=True)
class WorkerOptions:
    """A projection worker's knobs (`fanout worker --help`, streams/worker.py)."""

    app_id: str | None = None  # the Faust app id = the consumer group; None: fanout-worker.<topic>
    web_port: int = 0  # Faust's web server on 127.0.0.1; 0: a free port
    batch: int = 500  # events per take
    within: float = 0.05  # seconds a take waits for more
    unit_events: int = 4000  # events a unit may gather from full takes while the log is ahead (ADR-0052)
    gather_for: float = 1.0  # seconds a unit may spend gathering them
    session_timeout: float = 10.0  # seconds before a dead worker's partitions move


@dataclass(frozen=True)
class RelayOptions:
    """The relay's knobs (`fanout relay --help`, streams/relay.py)."""

    batch: int = 500  # most events per Kafka transaction
    commit_interval: float = 0.02  # seconds: a transaction begins at most this often (group commit)
    log_interval: float = 5.0  # seconds between progress lines
    transactional_id: str | None = None  # None: fanout-relay.<topic> (a second relay fences the first)


@dataclass(frozen=True)
class Settings:
    params: Parameters
    data_dir: Path
    event_store: str
    log: str
    views: str
    secret: str | None
    worker: WorkerOptions = WorkerOptions()
    relay: RelayOptions = RelayOptions()

    @classmethod
    def embedded(cls, data_dir: Path | str, params: Parameters | None = None) -> Settings:
        """The embedded runtime's engines over a data dir (what a FANOUT_ environment that
        names no engine loads), with these parameters (default ones when None)."""
        return cls(params or Parameters(), Path(data_dir), *EMBEDDED, None)


# What a process of each kind needs of the engine settings (load_settings' `role`).
Role = Literal["runtime", "worker", "relay"]


def load_settings(
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
    *,
    role: Role = "runtime",
    data_dir: Path | str | None = None,
) -> Settings:
    """The settings of `env` (default the process's environment) and the config file
    (`config_file`, else FANOUT_CONFIG). `role` says which engines are checked: "runtime"
    (serve and the tools) the embedded or the distributed triple (`check_engines`);
    "worker" PostgreSQL, Kafka and Cassandra or a data dir's SQLite views (`check_worker`);
    "relay" PostgreSQL and Kafka (`check_relay`). `data_dir` (a --data-dir flag) stands
    before FANOUT_DATA_DIR."""
    env = dict(os.environ if env is None else env)
    values: dict[str, str] = {}
    path = config_file or env.get("FANOUT_CONFIG")
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"FANOUT_CONFIG: cannot read {path}: {exc}") from exc
        values.update({f"FANOUT_{k.upper()}": str(v) for k, v in raw.items()})
    values.update({k: v for k, v in env.items() if k.startswith("FANOUT_")})

    params = Parameters()
    updates: dict[str, Any] = {}
    for name, (parse, land) in _PARAMS.items():
        key = f"FANOUT_{name}"
        if key in values:
            try:
                updates.update(land(parse(values[key])))
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{key}={values[key]!r}: {exc}") from None
    params = replace(params, **updates)
    if params.small_max_members >= params.medium_max_members:
        raise ConfigError("FANOUT_SMALL_MAX_MEMBERS must be below FANOUT_MEDIUM_MAX_MEMBERS")

    given = {k: values.get(f"FANOUT_{k}", "") for k in ("EVENT_STORE", "LOG", "VIEWS")}
    if role == "relay":
        given = {k: v.strip() for k, v in given.items()}
    if role == "worker":
        check_worker(given["EVENT_STORE"], given["LOG"], given["VIEWS"])
        if given["VIEWS"] == "sqlite" and data_dir is None and "FANOUT_DATA_DIR" not in values:
            raise ConfigError("FANOUT_VIEWS=sqlite needs --data-dir or FANOUT_DATA_DIR")
    elif role == "relay":
        check_relay(given["EVENT_STORE"], given["LOG"])
    event_store, log, views = (given[k] or embedded for k, embedded in zip(given, EMBEDDED, strict=True))
    if role == "runtime":
        check_engines(event_store, log, views)
    unknown = sorted(
        k
        for k in values
        if k.startswith("FANOUT_")
        and not k.startswith(TOOLING_PREFIXES)
        and k[7:] not in _PARAMS
        and k
        not in {"FANOUT_DATA_DIR", "FANOUT_EVENT_STORE", "FANOUT_LOG", "FANOUT_VIEWS", "FANOUT_SECRET", "FANOUT_CONFIG"}
    )
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]}; known: {', '.join('FANOUT_' + n for n in _PARAMS)}")
    where = Path(data_dir) if data_dir is not None else Path(values.get("FANOUT_DATA_DIR", "./data"))
    return Settings(params, where, event_store, log, views, values.get("FANOUT_SECRET"))


EMBEDDED = ("sqlite", "embedded", "sqlite")


def check_engines(event_store: str, log: str, views: str) -> None:
    """The embedded runtime (sqlite, embedded, sqlite) or the distributed one (postgresql://,
    kafka://, cassandra://): all three of one, each URL well formed."""
    if (event_store, log, views) == EMBEDDED:
        return
    distributed = (
        ("FANOUT_EVENT_STORE", event_store, "postgresql://", urls.postgres_env),
        ("FANOUT_LOG", log, "kafka://", urls.kafka_settings),
        ("FANOUT_VIEWS", views, "cassandra://", urls.cassandra_settings),
    )
    for (key, value, scheme, parse), embedded in zip(distributed, EMBEDDED, strict=True):
        if value == embedded or not value.startswith(scheme.rstrip("/").replace("postgresql:", "postgres")):
            raise ConfigError(
                f"{key}={value!r}: the embedded runtime takes sqlite/embedded/sqlite, the distributed one "
                f"postgresql://, kafka:// and cassandra:// URLs for all three (SPEC section 8); this mixes them"
                if value == embedded
                else f"{key}={value!r}: expected {embedded!r} or a {scheme} URL"
            )
        try:
            parse(value)
        except urls.UrlError as exc:
            raise ConfigError(str(exc)) from None


def check_worker(event_store: str, log: str, views: str) -> None:
    """A projection worker's engines: the PostgreSQL event store (to decode the records and
    open reviews), the Kafka log, and the Cassandra views or `sqlite` (a data dir's views,
    for a single worker); each URL well formed."""
    if not event_store.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"FANOUT_EVENT_STORE={event_store!r}: the worker needs the PostgreSQL event store (postgresql://...)"
        )
    try:
        urls.kafka_settings(log)
        if views.startswith("cassandra://"):
            urls.cassandra_settings(views)
        elif views != "sqlite":
            raise ConfigError(f"FANOUT_VIEWS={views!r}: expected a cassandra:// URL or sqlite")
        urls.postgres_env(event_store)
    except urls.UrlError as exc:
        raise ConfigError(str(exc)) from None


def check_relay(event_store: str, log: str) -> None:
    """The relay's engines: the PostgreSQL event store it follows and the Kafka log it
    writes, both set and well formed (FANOUT_VIEWS is not its business)."""
    for key, value, example in (
        ("FANOUT_EVENT_STORE", event_store, "postgresql://user@host:5432/dbname"),
        ("FANOUT_LOG", log, "kafka://host:9092"),
    ):
        if not value.strip():
            raise ConfigError(f"{key} is not set; the relay needs it, e.g. {key}={example}")
    try:
        urls.postgres_env(event_store.strip())
        urls.kafka_settings(log.strip())
    except urls.UrlError as exc:
        raise ConfigError(str(exc)) from None


def is_distributed(settings: Settings) -> bool:
    return (settings.event_store, settings.log, settings.views) != EMBEDDED


def parameter_names() -> list[str]:
    return [f"FANOUT_{n}" for n in _PARAMS]


def describe(params: Parameters) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in fields(params)}
