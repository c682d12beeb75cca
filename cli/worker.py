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
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROG = "fanout worker"
log = logging.getLogger("fanout.worker")


class WorkerError(RuntimeError):
    """A failure the operator can fix: one line, exit 2."""


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
    """The ADR parameters from the FANOUT_ settings. The engine URLs are parsed here, by
    fanout.urls: the settings loader is asked for the parameters only."""
    from fanout.config import load_settings

    env = {**os.environ, "FANOUT_EVENT_STORE": "sqlite", "FANOUT_LOG": "embedded", "FANOUT_VIEWS": "sqlite"}
    return load_settings(env, config_file=config).params


def _open_views(url: str, data_dir: str | None, params: Any, partitions: int, stack: list[Any]) -> Any:
    if url == "sqlite":
        from fanout.bootstrap import DataDirLock, open_mailbox, open_views

        if not data_dir:
            raise WorkerError("FANOUT_VIEWS=sqlite needs --data-dir or FANOUT_DATA_DIR")
        path = Path(data_dir)
        path.mkdir(parents=True, exist_ok=True)
        lock = DataDirLock(path)
        lock.acquire()
        stack.append(lock.release)
        from fanout.rereview import MailboxMeter

        return open_views(path, params.mailbox_shards, mailbox=MailboxMeter(open_mailbox(path, params.mailbox_shards)))
    if url.startswith("cassandra://"):
        from fanout.urls import cassandra_settings

        settings = cassandra_settings(url)
        try:
            import adapters.cassandra.views  # noqa: F401  (the driver is in this build)
        except ImportError:
            raise WorkerError("FANOUT_VIEWS=cassandra://: the Cassandra views adapter is not in this build") from None
        from fanout.bootstrap import open_cassandra_views

        try:
            # one session for the views and the mailbox; the mailbox timed: its unit cost in the
            # heartbeats (re-review condition 4, ADR-0026)
            return open_cassandra_views(settings, partitions=partitions)
        except Exception as exc:
            raise WorkerError(f"FANOUT_VIEWS: cannot open the views at {url}: {_line(exc)}") from None
    raise WorkerError(f"FANOUT_VIEWS={url!r}: expected a cassandra:// URL or sqlite")


def cmd_worker(args: argparse.Namespace, settings: Any = None, data_dir: Path | None = None) -> int:
    from fanout.urls import UrlError, kafka_settings, postgres_env

    env = os.environ
    closers: list[Any] = []
    try:
        params = settings.params if settings is not None else _params(getattr(args, "config", None))
        store_url = env.get("FANOUT_EVENT_STORE", "")
        if not store_url.startswith(("postgresql://", "postgres://")):
            raise WorkerError(
                f"FANOUT_EVENT_STORE={store_url!r}: the worker needs the PostgreSQL event store (postgresql://...)"
            )
        kafka = kafka_settings(env.get("FANOUT_LOG", ""))
        views_url = env.get("FANOUT_VIEWS", "")
        if views_url.startswith("cassandra://"):
            from fanout.urls import cassandra_settings

            cassandra_settings(views_url)  # a malformed URL stops here, before any engine is opened
        elif views_url != "sqlite":
            raise WorkerError(f"FANOUT_VIEWS={views_url!r}: expected a cassandra:// URL or sqlite")
        data = (
            getattr(args, "data_dir", None)
            or (str(data_dir) if data_dir is not None else None)
            or env.get("FANOUT_DATA_DIR")
        )
        return _run(args, params, postgres_env(store_url), kafka, views_url, data, closers)
    except UrlError as exc:
        raise WorkerError(str(exc)) from None
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception:
                log.exception("closing failed")


def _run(
    args: argparse.Namespace,
    params: Any,
    store_env: dict[str, str],
    kafka: Any,
    views_url: str,
    data_dir: str | None,
    closers: list[Any],
) -> int:
    from confluent_kafka import KafkaException

    from fanout.application import FanoutApplication
    from fanout.event_store import EventStoreUnavailable, check_event_store
    from projections.capacity import ReviewTrigger
    from projections.delivery import Delivered
    from projections.hosting import Effect, ViewsTracked
    from streams.kafka import TopicUnavailable, ensure_topic
    from streams.kafka_health import process_health
    from streams.pushes import PushPublisher, pushes_topic
    from streams.records import MAX_RECORD_BYTES, EventRecord
    from streams.worker import ProjectionWorker, WorkerSettings

    logging.basicConfig(
        level=args.loglevel.upper(), format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"
    )
    # Kafka's clients say "unreachable" once and then a summary, not a line per attempt; muted
    # until the worker runs (a start-up failure is this command's one line).
    health = process_health(kafka.bootstrap)
    health.muted = True
    try:
        check_event_store(store_env)  # names the URL and what to do, not "couldn't get a connection"
        app = FanoutApplication(params, store_env, shared_store=True)  # replicas and workers write too
    except EventStoreUnavailable as exc:
        raise WorkerError(str(exc)) from None
    except Exception as exc:
        raise WorkerError(f"FANOUT_EVENT_STORE: cannot open the event store: {_line(exc)}") from None
    closers.append(app.close)
    views = _open_views(views_url, data_dir, params, kafka.partitions, closers)
    closers.append(views.close)
    try:
        ensure_topic(
            kafka.bootstrap,
            kafka.topic,
            kafka.partitions,
            kafka.replication,
            max_message_bytes=MAX_RECORD_BYTES,
            timeout=15.0,
            min_insync=kafka.min_insync,
        )
        publisher = PushPublisher(
            kafka.bootstrap,
            pushes_topic(kafka.topic),
            partitions=kafka.partitions,
            replication=kafka.replication,
            min_insync=kafka.min_insync,
            on_delivered=health.reachable,  # a heartbeat acknowledged: Kafka answers
        )
    except (KafkaException, TopicUnavailable) as exc:
        raise WorkerError(_kafka_down(kafka.bootstrap, exc)) from None
    closers.append(publisher.close)

    def to_domain_event(record: EventRecord) -> Any:
        return app.mapper.to_domain_event(record.stored_event())

    def on_effects(effects: Sequence[Effect]) -> None:
        """After a unit of work committed: the pushes (invariant O), then the reviews."""
        publisher.publish(e for e in effects if isinstance(e, Delivered | ViewsTracked))
        for t in effects:
            if not isinstance(t, ReviewTrigger):
                continue
            try:
                app.open_review(
                    t.tenant, t.size_bucket, t.trigger, t.details, "capacity-monitor", review_key=t.review_key
                )
            except Exception:
                log.exception("could not open the review %s triggered (the views are committed)", t.trigger)

    faust_dir = Path(tempfile.mkdtemp(prefix="fanout-worker-"))
    closers.append(lambda: shutil.rmtree(faust_dir, ignore_errors=True))
    try:
        worker = ProjectionWorker(
            WorkerSettings(
                bootstrap=kafka.bootstrap,
                topic=kafka.topic,
                partitions=kafka.partitions,
                replication=kafka.replication,
                min_insync=kafka.min_insync,
                app_id=args.app_id,
                web_port=args.web_port,
                datadir=faust_dir,
                batch=args.batch,
                within=args.within,
                session_timeout=args.session_timeout,
            ),
            views,
            params,
            to_domain_event,
            on_effects,
            beat=publisher.beat,
        )
    except (KafkaException, TopicUnavailable, LookupError) as exc:
        raise WorkerError(_kafka_down(kafka.bootstrap, exc)) from None
    print(
        f"fanout: worker {worker.settings.group} consuming {kafka.topic} at {kafka.bootstrap} (read_committed), "
        f"pushes to {pushes_topic(kafka.topic)}, views {views_url}",
        flush=True,
    )
    health.unmute()
    code = 0
    try:
        worker.run(args.loglevel)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    s = worker.host.stats
    print(
        f"fanout: worker stopped: {s.applied} events applied in {s.units} units, {s.skipped} redelivered skipped",
        file=sys.stderr,
        flush=True,
    )
    return code


def _kafka_down(bootstrap: str, exc: BaseException) -> str:
    return (
        f"FANOUT_LOG: Kafka at {bootstrap} does not answer ({_line(exc)}): start it, "
        "or name the right host and port in FANOUT_LOG"
    )


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def main(argv: Sequence[str] | None = None) -> int:
    from fanout.bootstrap import DataDirBusy
    from fanout.config import ConfigError, EngineUnavailable

    args = build_parser().parse_args(argv)
    try:
        return cmd_worker(args)
    except (WorkerError, ConfigError, EngineUnavailable, DataDirBusy, OSError) as exc:
        print(f"fanout: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
