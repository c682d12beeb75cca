"""`fanout relay`: the event store -> Kafka relay of the distributed runtime
(streams/relay.py, docs/adr/0013-relay-and-watermarks.md).

Configured by the environment only:
  FANOUT_EVENT_STORE=postgresql://user@host:port/dbname   the event store it follows
  FANOUT_LOG=kafka://host:port[?topic=&partitions=&replication=]   where it publishes

Creates the event store's tables and the topic when missing. Stops cleanly on SIGTERM or
SIGINT (the transaction in progress is committed first). A bad or missing URL prints one
line and exits 2; an unreachable engine, or being fenced by a newer relay of the same
topic, prints one line and exits 1. Also runs as `python -m cli.relay`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fanout.config import ConfigError, ProcessFailed, RelayOptions, Settings

PROG = "fanout"

_DESCRIPTION = (
    "Follow the PostgreSQL event store's notification log (LISTEN/NOTIFY) and publish every event to the "
    "Kafka topic exactly once for read_committed consumers: one transaction per batch (group-committed at most "
    "every --commit-interval-ms), each ending with a "
    "watermark record on every partition; the relayed position is read back from the topic at start, so a "
    "kill -9 at any point neither loses nor duplicates an event. Configured by FANOUT_EVENT_STORE "
    "(postgresql://...) and FANOUT_LOG (kafka://...). Stops cleanly on SIGINT or SIGTERM."
)
DESCRIPTION = textwrap.fill(_DESCRIPTION, 100)
EPILOG = (
    "example:\n"
    "  fanout relay   # with FANOUT_EVENT_STORE=postgresql://postgres@127.0.0.1:5432/fanout\n"
    "                 # and FANOUT_LOG='kafka://127.0.0.1:9092?topic=fanout.events&partitions=6'"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = RelayOptions()  # the defaults, written once (fanout/config.py)
    p.add_argument("--batch", type=int, default=d.batch, help=f"most events per Kafka transaction (default {d.batch})")
    p.add_argument(
        "--commit-interval-ms",
        type=float,
        default=d.commit_interval * 1000.0,
        help="group commit: a Kafka transaction begins at most this often, in ms, with every event that queued "
        f"meanwhile (default {d.commit_interval * 1000.0:g}; a lone event after a quiet spell goes at once; "
        "0 = a transaction per wake-up)",
    )
    p.add_argument(
        "--log-interval",
        type=float,
        default=d.log_interval,
        help=f"seconds between progress lines (default {d.log_interval:g})",
    )
    p.add_argument(
        "--transactional-id",
        metavar="ID",
        default=d.transactional_id,
        help="Kafka transactional id (default fanout-relay.<topic>: a second relay of the topic fences the first)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines (errors only)")
    p.add_argument("--verbose", "-v", action="store_true", help="also librdkafka's own log lines, and tracebacks")


def add_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """The `relay` subcommand, for cli/main.py's subparsers; its func is `cmd_relay`."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "relay",
        help="event store -> Kafka relay (distributed runtime)",
        description=DESCRIPTION,
        epilog=EPILOG,
        parents=list(parents),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=cmd_relay, role="relay")
    return p


def cmd_relay(args: argparse.Namespace, settings: Settings, data_dir: Any = None) -> int:
    """cli/main.py's calling convention: `settings` loaded for the relay (`load_settings(
    role="relay")`: FANOUT_EVENT_STORE and FANOUT_LOG; the data dir is not used)."""
    from cli.exits import exit_code

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("fanout.relay")
    log.setLevel(logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO)
    # librdkafka's own lines (a broker down, retries) repeat every few seconds; the relay
    # reports what stops it in one line of its own.
    rdkafka = logging.getLogger("fanout.relay.rdkafka")
    rdkafka.setLevel(logging.CRITICAL if not args.verbose else logging.DEBUG)
    try:
        return _run(replace(settings, relay=options(args)), rdkafka)
    except Exception as exc:
        code = exit_code(exc, engine_down=1)  # an engine that does not answer: exit 1 (the module doc)
        if code is None:
            raise
        return code


def options(args: argparse.Namespace) -> RelayOptions:
    """The command line's knobs (a bad one is a ConfigError naming its flag)."""
    if args.batch < 1:
        raise ConfigError("--batch must be at least 1")
    if not args.commit_interval_ms >= 0:
        raise ConfigError("--commit-interval-ms must be 0 or more")
    return RelayOptions(
        batch=args.batch,
        commit_interval=args.commit_interval_ms / 1000.0,
        log_interval=args.log_interval,
        transactional_id=args.transactional_id,
    )


def _run(settings: Settings, rdkafka: logging.Logger) -> int:
    from fanout.bootstrap.relay import bootstrap_relay

    process = bootstrap_relay(settings, kafka_logger=rdkafka)

    def stop(signum: int, _frame: Any) -> None:
        process.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        process.run()
    except ProcessFailed:
        raise
    except Exception as exc:  # unexpected: one line; the traceback with --verbose
        logging.getLogger("fanout.relay").debug("relay failed", exc_info=True)
        raise ProcessFailed(f"the relay failed: {type(exc).__name__}: {exc}") from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        process.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from cli.exits import exit_code
    from fanout.config import load_settings

    parser = argparse.ArgumentParser(
        prog=f"{PROG} relay",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        options(args)  # the flags first, then the settings (as the relay has always said them)
        settings = load_settings(role="relay")
    except ConfigError as exc:
        return exit_code(exc) or 2
    return cmd_relay(args, settings)


if __name__ == "__main__":
    sys.exit(main())
