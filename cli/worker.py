"""`fanout worker`: the projection worker of the distributed runtime (streams/worker.py).

Configured by the engine URLs of SPEC section 8:

* FANOUT_EVENT_STORE=postgresql://...  the application's mapper (to decode event records)
  and the reviews T1/T2 open (`FanoutApplication.open_review`);
* FANOUT_LOG=kafka://host:port?topic=...&partitions=...&replication=...  the event topic;
  online pushes go to `<topic>.pushes`;
* FANOUT_VIEWS=cassandra://host:port/keyspace  the shared views (any number of workers), or
  `sqlite` with --data-dir / FANOUT_DATA_DIR: the SQLite views with the RocksDB mailbox of a
  data dir (one worker: the data dir's lock is taken).

The ADR parameters come from the FANOUT_<NAME> settings as for every command (FANOUT_MAILBOX_SHARDS
must match the views). Run as `fanout worker` or `python -m cli.worker`. A bad setting or an
engine that does not answer at start-up is one line and exit 2; SIGINT/SIGTERM stop it."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROG = "fanout worker"


DESCRIPTION = (
    "Run a projection worker: a Faust app consuming the event topic the relay writes (read_committed), "
    "hosting the delivery, capacity and admin projections over the views (one unit of work per partition "
    "and batch, tracking per (projection, partition)), publishing online pushes to <topic>.pushes after "
    "each commit and opening the reviews T1/T2 trigger. Several workers share the topic's partitions "
    "(one consumer group). Engines: FANOUT_EVENT_STORE=postgresql://..., FANOUT_LOG=kafka://..., "
    "FANOUT_VIEWS=cassandra://... (or sqlite with --data-dir for a single worker)."
)
EXAMPLE = "fanout worker --web-port 6066   # with FANOUT_EVENT_STORE, FANOUT_LOG and FANOUT_VIEWS set"


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--web-port", type=int, default=0, help="Faust's web server port on 127.0.0.1 (default: a free one)")
    p.add_argument("--app-id", metavar="ID", help="the Faust app id = consumer group (default fanout-worker.<topic>)")
    p.add_argument("--batch", type=int, default=500, help="events taken per batch (default 500)")
    p.add_argument("--within", type=float, default=0.05, help="seconds a batch waits for more events (default 0.05)")
    p.add_argument(
        "--unit-events",
        type=int,
        default=4000,
        help="events one unit of work may gather from full batches while the log is ahead of the worker "
        "(default 4000; the --batch size turns it off)",
    )
    p.add_argument(
        "--gather-for",
        type=float,
        default=1.0,
        help="seconds a unit may spend gathering full batches (default 1.0)",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=10.0,
        help="seconds before a dead worker's partitions move (default 10)",
    )
    p.add_argument("--loglevel", default="info", choices=["debug", "info", "warning", "error"], help="(default info)")
    return p


def add_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """`fanout worker` in the main command's subparsers (cli/main.py style)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "worker",
        help="Faust projection worker (distributed runtime)",
        description=DESCRIPTION,
        epilog="example:\n  " + EXAMPLE,
        parents=list(parents),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(p)
    p.set_defaults(func=cmd_worker)
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog="example:\n  " + EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", metavar="DIR", help="data directory for FANOUT_VIEWS=sqlite (default FANOUT_DATA_DIR)")
    p.add_argument("--config", metavar="FILE", help="TOML file setting FANOUT_ parameters by name")
    return configure(p)


# -- the command ----------------------------------------------------------------------------


def _params(config: str | None) -> Any:
    """The ADR parameters from the FANOUT_ settings. The engine URLs are parsed by the
    composition root: the settings loader is asked for the parameters only."""
    from fanout.config import load_settings

    env = {**os.environ, "FANOUT_EVENT_STORE": "sqlite", "FANOUT_LOG": "embedded", "FANOUT_VIEWS": "sqlite"}
    return load_settings(env, config_file=config).params


def cmd_worker(args: argparse.Namespace, settings: Any = None, data_dir: Path | None = None) -> int:
    from fanout.bootstrap.worker import WorkerOptions, bootstrap_worker

    env = os.environ
    params = settings.params if settings is not None else _params(getattr(args, "config", None))
    data = (
        getattr(args, "data_dir", None)
        or (str(data_dir) if data_dir is not None else None)
        or env.get("FANOUT_DATA_DIR")
    )
    logging.basicConfig(
        level=args.loglevel.upper(), format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"
    )
    options = WorkerOptions(
        app_id=args.app_id,
        web_port=args.web_port,
        batch=args.batch,
        within=args.within,
        unit_events=args.unit_events,
        gather_for=args.gather_for,
        session_timeout=args.session_timeout,
    )
    process = bootstrap_worker(env, params, options, data)
    try:
        print(f"fanout: {process.description}", flush=True)
        code = process.run(args.loglevel)
        s = process.stats()
        print(
            f"fanout: worker stopped: {s.applied} events applied in {s.units} units, {s.skipped} redelivered skipped",
            file=sys.stderr,
            flush=True,
        )
        return code
    finally:
        process.close()


def main(argv: Sequence[str] | None = None) -> int:
    from fanout.bootstrap import DataDirBusy
    from fanout.config import ConfigError, EngineUnavailable

    args = build_parser().parse_args(argv)
    try:
        return cmd_worker(args)
    except (ConfigError, EngineUnavailable, DataDirBusy, OSError) as exc:
        print(f"fanout: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
