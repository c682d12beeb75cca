"""The embedded runtime's wiring (`fanout serve` on one machine, the default): eventsourcing's
SQLite event store, the SQLite views with the RocksDB mailbox (ADR-0004), the in-process
projection host (`streams/embedded.py`) and the push hub, behind the data dir's lock. A
caller passes its own adapters instead (`views=`, `mailbox=`, `event_store_env=`; tests do).
The operator tools open the same stores through `open_views`, `open_mailbox` and
`open_application`, so which engine holds what is decided here only."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from eventsourcing.utils import get_topic

from adapters.rocksdb.mailbox import RocksMailbox, ShardCountMismatch
from adapters.sqlite.event_store import SqliteEventStoreFactory
from adapters.sqlite.views import SqliteViews
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap.power_loss import check_data_dir
from fanout.config import ConfigError, Settings
from fanout.effects import Count, Effects, open_review, push_online
from fanout.embedded import EmbeddedRuntime
from fanout.overload import Backpressure
from fanout.push import PushHub
from fanout.queries import Queries
from fanout.rereview import MailboxMeter
from fanout.runtime import ViewReads
from projections.capacity import ReviewTrigger
from projections.delivery import Delivered
from projections.hosting import Effect
from projections.ports import MailboxStore, MailboxTimer, ViewStore
from streams.embedded import EmbeddedRunner

__all__ = ["ShardCountMismatch"]  # the mailbox's own error, named for the CLI (cli/main.py)

log = logging.getLogger("fanout.runtime")

# (FANOUT_EVENT_STORE, FANOUT_LOG, FANOUT_VIEWS) this build can run.
EMBEDDED_ENGINES = ("sqlite", "embedded", "sqlite")


class DataDirBusy(RuntimeError):
    pass


def _embedded_runner(
    views: ViewStore, params: Parameters, app: FanoutApplication, on_effects: Callable[[Sequence[Effect]], None]
) -> EmbeddedRunner:
    """The embedded runtime's projector: the notification log into the one projection host;
    before it starts, what a power loss may have left in SQLite views is checked (ADR-0056)."""
    check = partial(check_data_dir, app, views, params) if isinstance(views, SqliteViews) else None
    return EmbeddedRunner(app, views, params, on_effects=on_effects, before_start=check)


def _projected(runner: EmbeddedRunner) -> None:
    """What a tier decision waits for (ViewReads.catch_up): the log written so far applied,
    while the runner runs (stopped, the views are read as they are)."""
    if runner.running:
        runner.wait_until(runner.log_position(), timeout=30)


def embedded_runtime(
    data_dir: Path,
    params: Parameters,
    views: ViewStore,
    event_store_env: Mapping[str, str],
    *,
    clock: Callable[[], float],
    lock: DataDirLock | None,
    meter: MailboxMeter | None,
) -> EmbeddedRuntime:
    """The embedded runtime's parts over views already open: the command side reading the
    views (ViewReads), the push hub, the runner with this process's effect handlers (pushes to
    its sockets, reviews opened), the backpressure that hears of every save."""
    runner: EmbeddedRunner  # the reads' progress is the runner's, built once the application is
    reads = ViewReads(views, position=lambda: runner.position(), catch_up=lambda: _projected(runner))
    app = FanoutApplication(params, dict(event_store_env), clock=clock, **reads.wiring())
    try:
        hub = PushHub(views)
        opened = Count()
        effects = Effects({Delivered: [push_online(hub, views)], ReviewTrigger: [open_review(app, opened=opened)]})
        runner = _embedded_runner(views, params, app, effects)
        app.saved_listeners.append(runner.wake)
        backpressure = Backpressure(
            runner,
            runner.log_position(),
            max_events=params.max_projection_lag_events,
            max_entries=params.max_projection_lag_entries,
        )
        app.recorded_listeners.append(backpressure.recorded)
        return EmbeddedRuntime(
            data_dir,
            params,
            views,
            app,
            runner,
            queries=Queries(views, params),
            hub=hub,
            backpressure=backpressure,
            reviews_opened=opened,
            lock=lock,
            meter=meter,
        )
    except BaseException:
        app.close()
        raise


class DataDirLock:
    """One writer process per data dir (serve, rebuild): an exclusive flock."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "fanout.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirBusy(
                f"{self.path.parent} is in use by another fanout process (serve or rebuild); stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- the engines of a data dir ----------------------------------------------------------


def sqlite_event_store(data_dir: Path) -> dict[str, str]:
    """eventsourcing's environment for the SQLite event store of a data dir (its recorders
    raise the port errors: adapters/sqlite/event_store.py)."""
    return {
        "PERSISTENCE_MODULE": get_topic(SqliteEventStoreFactory),
        "SQLITE_DBNAME": str(data_dir / "events.sqlite"),
        "SQLITE_LOCK_TIMEOUT": "30",
    }


def open_mailbox(data_dir: Path | str, shards: int, *, prefix: str = "") -> RocksMailbox:
    """The mailbox store (UserMailboxEntry): RocksDB, one column family per MailboxShard."""
    return RocksMailbox(Path(data_dir) / f"{prefix}mailbox.rocksdb", shards)


def open_views(
    data_dir: Path | str,
    shards: int,
    *,
    prefix: str = "",
    mailbox: MailboxStore | None = None,
    timer: MailboxTimer | None = None,
) -> SqliteViews:
    """The views of a data dir (or a set built aside, named by `prefix`) with their
    mailbox store: RocksDB unless one is given. The views own it (closing closes both).
    `timer`: told the mailbox layer's write times (fanout/rereview.py MailboxMeter, ADR-0026)."""
    mailbox = open_mailbox(data_dir, shards, prefix=prefix) if mailbox is None else mailbox
    try:
        return SqliteViews(data_dir, mailbox, prefix=prefix, timer=timer)
    except BaseException:
        mailbox.close()
        raise


class NoMailbox:
    """The mailbox store of views opened beside a running `serve` (RocksDB admits one
    process): for tools that read heads and states only. Any mailbox access is a bug."""

    def _refuse(self, *_: Any) -> Any:
        raise RuntimeError("these views were opened without their mailbox store")

    write = read = count = written = all_entries = sort_key = flush = reopen = _refuse

    def close(self) -> None:
        pass


def open_views_only(data_dir: Path | str, *, readonly: bool = False) -> SqliteViews:
    """The views of a data dir without the mailbox store: readable beside a running serve
    (`readonly`: not even a schema migration is written)."""
    return SqliteViews(data_dir, NoMailbox(), readonly=readonly)


def open_application(
    params: Parameters,
    data_dir: Path | str,
    *,
    env: Mapping[str, str] | None = None,
    create_tables: bool = True,
    **wiring: Any,
) -> FanoutApplication:
    """The command side over the data dir's event store (or the one `env` names).
    `create_tables=False` opens an existing store only (the tools that read beside serve)."""
    store = dict(sqlite_event_store(Path(data_dir)) if env is None else env)
    if not create_tables:
        store["CREATE_TABLE"] = "n"
    return FanoutApplication(params, store, **wiring)


# -- the embedded runtime ----------------------------------------------------------------


def bootstrap(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    views: ViewStore | None = None,
    mailbox: MailboxStore | None = None,
    event_store_env: Mapping[str, str] | None = None,
    lock: bool = True,
) -> EmbeddedRuntime:
    """The embedded runtime over the settings' data dir (`Settings.embedded(data_dir, params)`
    for a caller of its own; `fanout.config.load_settings` for the commands); settings naming
    the distributed engines go to `open_runtime` / `bootstrap_distributed`.

    Adapters given here are used instead of the ones built from the data dir, and the
    runtime owns them (close() closes them). `lock=False` skips the data dir's lock (a caller
    that holds it, like the demo)."""
    engines = (settings.event_store, settings.log, settings.views)
    if engines != EMBEDDED_ENGINES:
        raise ConfigError(
            f"engines {engines}: bootstrap builds the embedded runtime {EMBEDDED_ENGINES}; the distributed one "
            "(postgresql://, kafka://, cassandra://) is built by open_runtime / bootstrap_distributed"
        )
    params, data_dir = settings.params, Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_lock = DataDirLock(data_dir) if lock else None
    if data_lock is not None:
        data_lock.acquire()
    built: ViewStore | None = None
    try:
        meter: MailboxMeter | None = None
        if views is None:  # views handed in (tests) are used as they are, their mailbox untimed
            meter = MailboxMeter()  # the mailbox layer's write time per entry: re-review condition 4 (ADR-0026)
            views = built = open_views(data_dir, params.mailbox_shards, mailbox=mailbox, timer=meter)
        return embedded_runtime(
            data_dir,
            params,
            views,
            sqlite_event_store(data_dir) if event_store_env is None else event_store_env,
            clock=clock,
            lock=data_lock,
            meter=meter,
        )
    except BaseException:
        if built is not None:
            built.close()
        if data_lock is not None:
            data_lock.release()
        raise
