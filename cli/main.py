"""The `fanout` command line (SPEC section 6).

Every command takes --data-dir (default FANOUT_DATA_DIR or ./data) and --config FILE
(a TOML file with the FANOUT_ settings' names). A bad setting, a busy data dir or an
engine that cannot be used at start-up prints one line `fanout: error: ...` and exits 2.

Why this module is long: the `fanout` command's parser and one small handler per subcommand
(serve, replay, rebuild, verify, analyze, demo, relay, worker); each handler parses and calls
the composition root or a tool."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from cli.exits import PROG, CliError, exit_code
from fanout.config import Settings, load_settings, parse_duration


def strict_dumps(value: Any, **kwargs: Any) -> str:
    """JSON the CLI prints: strict (a NaN or Infinity is an error, never invalid JSON)."""
    from fanout import strict_json

    try:
        return strict_json.dumps(value, **kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None


# -- commands ---------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    from api.app import CannotListen, listen, run
    from fanout.bootstrap import open_runtime
    from fanout.runtime import Runtime
    from fanout.security import load_or_create_secret

    # Bind first: a port in use is one line and exit 2, before the data dir is opened
    # and before anything claims to be serving.
    try:
        sockets = listen(args.host, args.port)
    except CannotListen as exc:
        raise CliError(str(exc)) from None
    port = sockets[0].getsockname()[1]  # the real one when --port 0

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # unwinds into the finally below; the server also stops on it

    signal.signal(signal.SIGTERM, stop)
    try:
        runtime: Runtime = open_runtime(settings)  # over `data_dir`: main loaded the settings with it
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    try:
        secret = load_or_create_secret(data_dir, settings.secret)
        runtime.start()
        print(f"fanout: serving http://{args.host}:{port} (data dir {data_dir}, log position "
              f"{runtime.log_position()})", flush=True)  # fmt: skip
        print(
            f"fanout: mint a token with: fanout token --data-dir {data_dir} --tenant TENANT --role service --sub my-service",
            flush=True,
        )
        run(runtime, secret, args.host, port, sockets=sockets)
    except KeyboardInterrupt:
        pass
    finally:
        for sock in sockets:
            sock.close()
        runtime.close()
        print("fanout: stopped", file=sys.stderr, flush=True)
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    from fanout.security import load_or_create_secret, mint_token

    try:
        ttl = parse_duration(args.ttl)
    except ValueError as exc:
        raise CliError(f"--ttl: {exc}") from None
    if ttl <= 0:
        raise CliError("--ttl must be positive")
    secret = load_or_create_secret(data_dir, settings.secret, create=False)
    print(mint_token(secret, args.tenant, args.role, args.sub, ttl_seconds=int(ttl)))
    return 0


def cmd_replay(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    from tools.replay import Filters, ReplayError, parse_time, replay

    try:
        filters = Filters(
            since=parse_time(args.since) if args.since else None,
            until=parse_time(args.until) if args.until else None,
            conversation_id=args.conversation,
            tenant=args.tenant,
            types=frozenset(t.strip() for t in args.type.split(",") if t.strip()) if args.type else frozenset(),
            from_position=args.from_position,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    progress = not args.quiet and sys.stderr.isatty()
    try:  # the file is opened once the filters are checked: a typo leaves it alone
        out = sys.stdout if args.out in (None, "-") else Path(args.out)
        n = replay(data_dir, settings.params, filters, out, progress=progress, settings=settings)
    except ReplayError as exc:
        raise CliError(str(exc)) from None
    if not args.quiet:
        print(
            f"fanout: replayed {n} events" + (f" to {args.out}" if args.out not in (None, "-") else ""), file=sys.stderr
        )
    return 0


def _with_data_dir(settings: Settings, data_dir: Path) -> Settings:
    from dataclasses import replace

    return replace(settings, data_dir=data_dir)


def _progress(args: argparse.Namespace, settings: Settings) -> bool:
    """Progress on stderr unless -q: the embedded tools' bars on a terminal only (a log file
    gets the distributed tools' periodic lines, which take minutes)."""
    from fanout.config import is_distributed

    return not args.quiet and (is_distributed(settings) or sys.stderr.isatty())


def cmd_rebuild(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    from tools.rebuild import RebuildError, rebuild

    try:
        r = rebuild(_with_data_dir(settings, data_dir), args.target, progress=_progress(args, settings))
    except RebuildError as exc:
        raise CliError(str(exc)) from None
    if r.changed:
        print(
            f"rebuilt {r.target} from the log up to position {r.position} in {r.seconds:.2f}s; merged into the live tables:"
        )
        for table, n in r.rows.items():
            up, deleted = r.changed[table]
            print(f"  {table:<19} {n:>12,} rows  ({up:,} written, {deleted:,} deleted)")
        if "heads" in r.rows and any(r.changed.get("heads", (0, 0))):
            print(
                "running API replicas may serve the heads they cached before this merge for up to 5 minutes "
                "(ADR-0035); restart them to drop those at once"
            )
        return 0
    print(f"rebuilt {r.target} from the log up to position {r.position} in {r.seconds:.2f}s; swapped in:")
    for table, n in r.rows.items():
        print(f"  {table:<10} {n:>12,} rows")
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    from tools.rebuild import RebuildError, verify

    try:
        r = verify(_with_data_dir(settings, data_dir), limit=args.limit, progress=_progress(args, settings))
    except RebuildError as exc:
        raise CliError(str(exc)) from None
    print(f"verified views against the log up to position {r.position} in {r.seconds:.2f}s")
    for table, n in r.rows.items():
        c = r.counts.get(table)
        state = "ok" if c is None else f"DIFFERS: {c[0]} live-only, {c[1]} recomputed-only"
        print(f"  {table:<19} {n:>12,} rows  {state}")
    for table, (live, recomputed) in r.differences.items():
        print(f"\n{table}: first differences (ignoring materialized_at, online_pushes)")
        for row in live:
            print(f"  - live       {row}")
        for row in recomputed:
            print(f"  + recomputed {row}")
    if r.equal:
        print("views equal the log")
        return 0
    print("\nviews differ from the log: `fanout rebuild all` recomputes them", file=sys.stderr)
    return 1


def cmd_analyze(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    from tools import analyze, plots

    try:
        if args.what == "capacity":
            report = analyze.capacity_report(data_dir, settings.params, settings)
            if args.png:
                plots.plot_capacity(report, Path(args.png))  # draws, or refuses with exit 2
            if args.json:
                print(strict_dumps(report, indent=2))
            else:
                analyze.print_capacity(report, sys.stdout)
            if args.png:
                print(f"plot written to {args.png}", file=sys.stderr)
            return 0
        at = None
        if args.at:
            from tools.replay import parse_time

            at = parse_time(args.at).timestamp()
        report = analyze.alpha_report(
            data_dir,
            settings.params,
            tenant=args.tenant,
            min_saving=args.min_saving,
            max_active_ratio=args.max_active_ratio,
            now=at,
            settings=settings,
        )
    except (analyze.AnalyzeError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(strict_dumps(report, indent=2, default=str))
    else:
        analyze.print_alpha(report, sys.stdout)
    if args.png:
        try:
            plotted = plots.plot_alpha(report, Path(args.png), settings.params)
        except analyze.AnalyzeError as exc:
            raise CliError(str(exc)) from None
        example = " (with EXAMPLE thresholds: no review decided any, none given)" if plotted["example"] else ""
        print(f"plot written to {args.png}{example}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    from cli.demo import DemoError, main_demo

    try:
        if args.distributed:
            from cli.demo_distributed import main_distributed_demo

            return main_distributed_demo(args.members, settings.params, quiet=args.quiet, keep=args.keep,
                                         partitions=args.partitions)  # fmt: skip
        if args.keep or args.partitions is not None:
            raise CliError("--keep and --partitions go with --distributed")
        return main_demo(data_dir, args.members or 100_000, settings.params, args.force, args.quiet)
    except DemoError as exc:
        raise CliError(str(exc)) from None


# -- parser -----------------------------------------------------------------------------

EPILOG = """\
examples:
  fanout serve --data-dir ./data --port 8080
  fanout token --tenant acme --role service --sub billing-bot --ttl 1h
  fanout replay --type MessageSent,WritePolicyChanged --conversation general --tenant acme --out events.jsonl
  fanout rebuild mailbox
  fanout verify
  fanout analyze alpha --tenant acme --min-saving 20000 --max-active-ratio 0.05 --png alpha.png
  fanout demo --data-dir /tmp/fanout-demo --members 100000
  fanout demo --distributed --members 20000

settings: every parameter of SPEC section 3 is read from FANOUT_<NAME> (e.g.
FANOUT_POLICY_SWITCH_MIN_INTERVAL=2s) or from --config FILE (TOML, same names);
the data dir from --data-dir, FANOUT_DATA_DIR, or ./data."""


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("common options")
    g.add_argument("--data-dir", metavar="DIR", help="data directory (default: FANOUT_DATA_DIR or ./data)")
    g.add_argument(
        "--config", metavar="FILE", help="TOML file setting FANOUT_ parameters by name (e.g. max_group_members = 50000)"
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    common = [_common()]
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Large-group chat delivery with exact offline delivery (ADR-0003): server and tools.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str, description: str, epilog: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help,
            description=description,
            epilog="example:\n  " + epilog,
            parents=common,
            formatter_class=fmt,
        )

    p = add(
        "serve",
        "run the API (embedded runtime: with its projectors)",
        "Serve the HTTP/WebSocket API. Embedded runtime (the default): SQLite event store, in-process projectors, "
        "SQLite views and the RocksDB mailbox in the data dir. Distributed runtime (FANOUT_EVENT_STORE="
        "postgresql://..., FANOUT_LOG=kafka://..., FANOUT_VIEWS=cassandra://...): one API replica of any number; "
        "`fanout relay` and `fanout worker` run apart; tables and keyspace are created if absent. Creates the "
        "token secret on first start (unless FANOUT_SECRET is set; replicas must share it). Stops cleanly on "
        "SIGINT or SIGTERM.",
        "fanout serve --data-dir ./data --host 0.0.0.0 --port 8080",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.set_defaults(func=cmd_serve)

    p = add(
        "token",
        "mint a bearer token (HS256 JWT)",
        "Print a signed token with the claims tenant, role, sub and exp. The secret is FANOUT_SECRET or the one "
        "`fanout serve` created in the data dir.",
        "fanout token --tenant acme --role admin --sub alice --ttl 8h",
    )
    p.add_argument("--tenant", required=True, help="tenant claim")
    p.add_argument("--role", required=True, choices=["user", "service", "admin"], help="role claim")
    p.add_argument("--sub", required=True, help="subject: the user id (role user) or the caller's name")
    p.add_argument("--ttl", default="24h", help="lifetime: 500ms, 2s, 15m, 24h, 7d (default 24h)")
    p.set_defaults(func=cmd_token)

    p = add(
        "replay",
        "write the event log as JSONL (analysts)",
        "Stream every event of the log as one JSON line: position, type (e.g. Conversation.MessageSent), "
        "originator_id, version, timestamp (UTC, when recorded), tenant and conversation_id where they apply, "
        "and the event's attributes. Runs beside `fanout serve` (no lock, nothing written). Distributed runtime "
        "(FANOUT_EVENT_STORE=postgresql://...): reads the PostgreSQL log, beside the replicas and workers. "
        "Filters combine with AND; an unknown event type, or a tenant or conversation not in the log, is an error "
        "(exit 2) listing what there is.",
        "fanout replay --since 2026-08-14T00:00:00Z --type MessageSent --tenant acme --out - | jq .seq",
    )
    p.add_argument("--out", metavar="FILE", default="-", help="output file, or - for stdout (default)")
    p.add_argument("--since", metavar="TIME", help="only events recorded at or after TIME (ISO 8601 or epoch seconds)")
    p.add_argument("--until", metavar="TIME", help="only events recorded at or before TIME")
    p.add_argument("--conversation", metavar="CID", help="only events of this conversation_id")
    p.add_argument("--tenant", metavar="T", help="only events of this tenant")
    p.add_argument(
        "--type", metavar="TYPES", help="comma-separated event types: MessageSent or Conversation.MessageSent"
    )
    p.add_argument("--from-position", metavar="N", type=int, default=1, help="first log position to read (default 1)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(func=cmd_replay)

    p = add(
        "rebuild",
        "recompute a read model from the log and swap it in",
        "Rebuild mailbox, state (UserConversationState), heads (heads, messages, delivery records, reviews, tiers) "
        "or all, from position 0 of the log, aside (rebuild-* files), then swap: whole stores for all/mailbox, "
        "one transaction for state/heads. Takes the data-dir lock: stop `fanout serve` first. "
        "materialized_at and online_pushes of existing delivery records are kept.\n\n"
        "Distributed runtime (FANOUT_VIEWS=cassandra://.../KS, ADR-0016): builds aside in keyspace KS_rebuild from "
        "the PostgreSQL log up to the position the views hold, then merges it into the live tables of KS (rows "
        "missing or different written, rows the log does not explain deleted; runtime facts kept) and drops "
        "KS_rebuild. Before it: stop the relay, let the workers reach the log (GET /readyz views_position = "
        "event_store), stop EVERY `fanout worker` (refused while any is in the consumer group, or while the "
        "partitions stand at different positions). API replicas may keep serving: reads see each row old or "
        "rebuilt, writes queue in PostgreSQL. Afterwards start the workers, then the relay. A keyspace whose "
        "user_states predate the login's states copy (ADR-0043) reads the slower way until `rebuild state` "
        "(or all) has written the copy: the merge vouches for it.",
        "fanout rebuild all --data-dir ./data",
    )
    p.add_argument("target", choices=["mailbox", "state", "heads", "all"], help="what to rebuild")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_rebuild)

    p = add(
        "verify",
        "recompute everything from the log and diff it with the views",
        "Project the whole log into a scratch dir and compare it with the live views table by table "
        "(ignoring materialized_at and online_pushes) and the mailbox entry sets. Exits 0 when equal, 1 when "
        "anything differs. Takes the data-dir lock: stop `fanout serve` first.\n\n"
        "Distributed runtime: projects the PostgreSQL log into a scratch keyspace (KS_verify_<id>, dropped "
        "afterwards) up to the position the Cassandra views hold and compares the two table by table, streaming "
        "(progress on stderr). Runs beside replicas and workers while no event is being applied: it waits up to "
        "60 s for every log partition to stand at one position and fails (exit 2) if the views moved meanwhile; "
        "under traffic, stop the relay first.",
        "fanout verify --data-dir ./data --limit 5",
    )
    p.add_argument("--limit", type=int, default=10, help="differences shown per table (default 10)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_verify)

    p = add(
        "analyze",
        "alpha per size bucket, or capacity (T1/T2)",
        "alpha: per size bucket the conversations, members, alpha mean/p50/p90 and, under the given review "
        "parameters or each enabled tier's, how many conversations meet the enter criterion, their total saving "
        "N x (1 - alpha) and N_eq at the bucket's mean alpha; --png plots each conversation as N against alpha "
        "(log axes) with the two thresholds, the region meeting the enter criterion and the saving it brings "
        "(thresholds: --min-saving/--max-active-ratio, else each tier's or latest review's, else the example "
        "values 20000 and 0.05, marked as such). "
        "capacity: fanout entries/s, budget use and the T1/T2 state; --png plots entries/s over the window "
        "against the T1/T2 limits (refused with exit 2 when nothing was sent). "
        "Reads the views only; runs beside serve (distributed runtime: the Cassandra views; capacity merges "
        "the windows of every log partition).",
        "fanout analyze alpha --tenant acme --min-saving 20000 --max-active-ratio 0.05 --png alpha.png",
    )
    p.add_argument("what", choices=["alpha", "capacity"], help="which analysis")
    p.add_argument("--tenant", metavar="T", help="alpha: one tenant only (default: all)")
    p.add_argument("--min-saving", type=float, metavar="X", help="alpha: read_diffusion_min_saving to evaluate")
    p.add_argument("--max-active-ratio", type=float, metavar="Y", help="alpha: read_diffusion_max_active_ratio")
    p.add_argument("--at", metavar="TIME", help="alpha: evaluate activity at TIME (default now)")
    p.add_argument("--png", metavar="FILE", help="write a PNG plot (alpha: N vs alpha; capacity: entries/s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_analyze)

    p = add(
        "demo",
        "run ADR-0003 end to end in-process on a fresh data dir",
        "A large group and two small ones, driven with a fake clock (rate gates and the 24 h interval are "
        "honoured without waiting): sends with their cost records, low alpha, a review enabling mention_only, "
        "the switch, sends in mention_only, silent versus active sessions, PULL_HISTORY, a tier rollback, "
        "MARK_READ/REBUILD and the converged exact counts. Exits 1 if the counts do not converge.\n\n"
        "--distributed: the same story on the real engines, named by FANOUT_EVENT_STORE/FANOUT_LOG/FANOUT_VIEWS "
        "or by $FANOUT_ENGINES_DIR/engines.env (`make engines-up`): a fresh database, topic and keyspace of its "
        "own (dropped at the end unless --keep), `fanout relay` and `fanout worker` as subprocesses, the commands "
        "through an API replica, every step waiting for the views (progress on stderr).",
        "fanout demo --data-dir /tmp/fanout-demo --members 100000",
    )
    p.add_argument("--members", type=int, default=None, help="members of the large group (default 100000)")
    p.add_argument("--distributed", action="store_true", help="run on PostgreSQL, Kafka, Faust and Cassandra")
    p.add_argument("--keep", action="store_true", help="--distributed: keep the database, topic and keyspace")
    p.add_argument("--partitions", type=int, help="--distributed: partitions of the demo's topic (default 4)")
    p.add_argument("--force", action="store_true", help="delete fanout's files in a non-empty data dir first")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing")
    p.set_defaults(func=cmd_demo)

    from cli import relay, worker

    relay.add_parser(sub, common)
    worker.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir or ".")
    try:
        # the worker's and the relay's engines are checked as theirs (cli/worker.py, cli/relay.py)
        settings = load_settings(config_file=args.config, role=getattr(args, "role", "runtime"), data_dir=args.data_dir)
        data_dir = settings.data_dir
        return int(args.func(args, settings, data_dir))
    except BaseException as exc:  # one line and the exit code of cli/exits.py, or a bug's traceback
        code = exit_code(exc, data_dir)
        if code is None:
            raise
        return code


if __name__ == "__main__":
    sys.exit(main())
