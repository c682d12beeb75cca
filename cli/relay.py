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
import os
import signal
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

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
    p.add_argument("--batch", type=int, default=500, help="most events per Kafka transaction (default 500)")
    p.add_argument(
        "--commit-interval-ms",
        type=float,
        default=20.0,
        help="group commit: a Kafka transaction begins at most this often, in ms, with every event that queued "
        "meanwhile (default 20; a lone event after a quiet spell goes at once; 0 = a transaction per wake-up)",
    )
    p.add_argument("--log-interval", type=float, default=5.0, help="seconds between progress lines (default 5)")
    p.add_argument(
        "--transactional-id",
        metavar="ID",
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
    p.set_defaults(func=cmd_relay)
    return p


def cmd_relay(args: argparse.Namespace, settings: Any = None, data_dir: Any = None) -> int:
    """cli/main.py's calling convention (settings and data dir are not used: the relay's
    whole configuration is FANOUT_EVENT_STORE and FANOUT_LOG)."""
    return run(args)


def run(args: argparse.Namespace) -> int:
    from fanout.bootstrap.relay import RelayExit

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("fanout.relay")
    log.setLevel(logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO)
    # librdkafka's own lines (a broker down, retries) repeat every few seconds; the relay
    # reports what stops it in one line of its own.
    rdkafka = logging.getLogger("fanout.relay.rdkafka")
    rdkafka.setLevel(logging.CRITICAL if not args.verbose else logging.DEBUG)
    try:
        return _run(args, rdkafka)
    except RelayExit as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return exc.code


def _run(args: argparse.Namespace, rdkafka: logging.Logger) -> int:
    from fanout.bootstrap.relay import RelayExit, RelayOptions, bootstrap_relay

    options = RelayOptions(
        batch=args.batch,
        commit_interval=args.commit_interval_ms / 1000.0,
        log_interval=args.log_interval,
        transactional_id=args.transactional_id,
    )
    process = bootstrap_relay(os.environ, options, kafka_logger=rdkafka)

    def stop(signum: int, _frame: Any) -> None:
        process.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        process.run()
    except RelayExit:
        raise
    except Exception as exc:  # unexpected: one line; the traceback with --verbose
        logging.getLogger("fanout.relay").debug("relay failed", exc_info=True)
        raise RelayExit(f"the relay failed: {type(exc).__name__}: {exc}", 1) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        process.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} relay",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
