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


class RelayCliError(RuntimeError):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


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


def _setting(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        example = "postgresql://user@host:5432/dbname" if name == "FANOUT_EVENT_STORE" else "kafka://host:9092"
        raise RelayCliError(f"{name} is not set; the relay needs it, e.g. {name}={example}", 2)
    return value


def _check_postgres(env: dict[str, str]) -> None:
    """A plain connection first: it names the cause (eventsourcing's pool only says it got
    no connection after 30 s)."""
    import psycopg

    where = f"{env['POSTGRES_HOST']}:{env['POSTGRES_PORT']}/{env['POSTGRES_DBNAME']}"
    try:
        conn = psycopg.connect(
            host=env["POSTGRES_HOST"],
            port=int(env["POSTGRES_PORT"]),
            user=env["POSTGRES_USER"],
            password=env.get("POSTGRES_PASSWORD") or None,
            dbname=env["POSTGRES_DBNAME"],
            connect_timeout=int(env.get("POSTGRES_CONNECT_TIMEOUT", "5")),
        )
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RelayCliError(f"cannot reach the event store at {where}: {first}", 1) from None
    conn.close()


def run(args: argparse.Namespace) -> int:
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
    except RelayCliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return exc.code


def _run(args: argparse.Namespace, rdkafka: logging.Logger) -> int:
    from domain.params import Parameters
    from fanout.application import FanoutApplication
    from fanout.urls import UrlError, kafka_settings, postgres_env
    from streams.relay import Relay, RelayError

    if args.batch < 1:
        raise RelayCliError("--batch must be at least 1", 2)
    if not args.commit_interval_ms >= 0:
        raise RelayCliError("--commit-interval-ms must be 0 or more", 2)
    try:
        env = postgres_env(_setting("FANOUT_EVENT_STORE"))
        kafka = kafka_settings(_setting("FANOUT_LOG"))
    except UrlError as exc:
        raise RelayCliError(str(exc), 2) from None
    _check_postgres(env)
    try:
        app = FanoutApplication(Parameters(), {**env, "CREATE_TABLE": "y"})
    except Exception as exc:  # the store answered a moment ago: say what it said now
        raise RelayCliError(f"cannot open the event store: {type(exc).__name__}: {exc}", 1) from None
    relay = Relay(
        app,
        bootstrap=kafka.bootstrap,
        topic=kafka.topic,
        partitions=kafka.partitions,
        replication=kafka.replication,
        min_insync=kafka.min_insync,
        transactional_id=args.transactional_id,
        batch=args.batch,
        commit_interval=args.commit_interval_ms / 1000.0,
        log_interval=args.log_interval,
        kafka_logger=rdkafka,
    )

    def stop(signum: int, _frame: Any) -> None:
        relay.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        relay.run()
    except RelayError as exc:
        raise RelayCliError(str(exc), 1) from None
    except Exception as exc:  # unexpected: one line; the traceback with --verbose
        logging.getLogger("fanout.relay").debug("relay failed", exc_info=True)
        raise RelayCliError(f"the relay failed: {type(exc).__name__}: {exc}", 1) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        app.close()
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
