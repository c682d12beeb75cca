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
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fanout.config import Settings, WorkerOptions

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
    d = WorkerOptions()  # the defaults, written once (fanout/config.py)
    p.add_argument(
        "--web-port", type=int, default=d.web_port, help="Faust's web server port on 127.0.0.1 (default: a free one)"
    )
    p.add_argument(
        "--app-id",
        metavar="ID",
        default=d.app_id,
        help="the Faust app id = consumer group (default fanout-worker.<topic>)",
    )
    p.add_argument("--batch", type=int, default=d.batch, help=f"events taken per batch (default {d.batch})")
    p.add_argument(
        "--within", type=float, default=d.within, help=f"seconds a batch waits for more events (default {d.within})"
    )
    p.add_argument(
        "--unit-events",
        type=int,
        default=d.unit_events,
        help="events one unit of work may gather from full batches while the log is ahead of the worker "
        f"(default {d.unit_events}; the --batch size turns it off)",
    )
    p.add_argument(
        "--gather-for",
        type=float,
        default=d.gather_for,
        help=f"seconds a unit may spend gathering full batches (default {d.gather_for})",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=d.session_timeout,
        help=f"seconds before a dead worker's partitions move (default {d.session_timeout:g})",
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
    p.set_defaults(func=cmd_worker, role="worker")
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


def options(args: argparse.Namespace) -> WorkerOptions:
    return WorkerOptions(
        app_id=args.app_id,
        web_port=args.web_port,
        batch=args.batch,
        within=args.within,
        unit_events=args.unit_events,
        gather_for=args.gather_for,
        session_timeout=args.session_timeout,
    )


def cmd_worker(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    """`settings` loaded for a worker (`load_settings(role="worker")`), the data dir of
    FANOUT_VIEWS=sqlite (--data-dir or FANOUT_DATA_DIR)."""
    from fanout.bootstrap.worker import bootstrap_worker

    logging.basicConfig(
        level=args.loglevel.upper(), format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"
    )
    process = bootstrap_worker(replace(settings, data_dir=data_dir, worker=options(args)))
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
    from cli.exits import exit_code
    from fanout.config import load_settings

    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(config_file=args.config, role="worker", data_dir=args.data_dir)
        return cmd_worker(args, settings, settings.data_dir)
    except BaseException as exc:
        code = exit_code(exc)
        if code is None:
            raise
        return code


if __name__ == "__main__":
    sys.exit(main())
