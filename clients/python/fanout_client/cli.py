"""`fanout-client`: the client rule from the command line, for people and scripts."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Sequence

from fanout_client.client import NotCaughtUp, UserClient
from fanout_client.errors import FanoutClientError
from fanout_client.http import Refresh
from fanout_client.stores import SqliteStore

EXIT_OK, EXIT_BEHIND, EXIT_REFUSED = 0, 1, 2

EPILOG = """\
Each conversation is printed as one JSON object per line:
  {"conversation_id", "latest_seq", "read_seq", "unread", "unread_exact", "mentions",
   "write_policy", "held": [[first, last], ...], "gaps": [[first, last], ...]}
held: the seqs this state holds (merged ranges); gaps: the seqs it knows it lacks.

exit status: 0 caught up; 1 not caught up (gaps open, the server unreachable in time);
2 refused (bad token, another user's state file, a bad argument). Errors: one line on stderr.

examples:
  fanout-client sync --url http://localhost:8080 --token "$TOKEN" --state alice.db
  fanout-client sync --url http://localhost:8080 --token "$TOKEN" --state alice.db --follow 30
  fanout-client read --url http://localhost:8080 --token "$TOKEN" --state alice.db --conversation general
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fanout-client",
        description="Sync a fanout user's conversations (PROTOCOL's client rule: no undetectable gap) "
        "into a state file, and mark them read.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{sync,read}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", required=True, help="the server, e.g. http://localhost:8080")
    common.add_argument("--token", required=True, help="a user token (fanout token --role user ...)")
    common.add_argument("--state", required=True, help="the SQLite state file (created when missing)")
    common.add_argument(
        "--token-command", help="a command printing a fresh token, run when the server refuses the token"
    )
    common.add_argument("--timeout", type=float, default=30.0, help="seconds to catch up before giving up (default 30)")
    s = sub.add_parser(
        "sync", parents=[common], help="catch up, print each conversation's state",
        description="Run the client rule until every gap it can see is filled, store the state, print it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    s.add_argument("--follow", type=float, metavar="SECONDS", help="then follow live frames for SECONDS")
    r = sub.add_parser(
        "read", parents=[common], help="MARK_READ a conversation, print its state",
        description="Catch up, MARK_READ the conversation (to the latest seq held without --seq), print its state.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    r.add_argument("--conversation", required=True, help="the conversation id")
    r.add_argument("--seq", type=int, help="the read seq (default: the latest seq held)")
    return p


def token_command(command: str | None) -> Refresh | None:
    """The refresh callback of --token-command: its stdout, stripped (no token when it fails)."""
    if command is None:
        return None

    async def refresh() -> str:
        proc = await asyncio.create_subprocess_exec(*shlex.split(command), stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        return out.decode().strip() if proc.returncode == 0 else ""

    return refresh


async def run(args: argparse.Namespace) -> int:
    store = SqliteStore(args.state)
    client = UserClient(args.url, args.token, store, refresh_token=token_command(args.token_command))
    try:
        await client.wait_caught_up(args.timeout)
        if args.command == "sync" and args.follow:
            await asyncio.sleep(args.follow)
            await client.wait_caught_up(args.timeout)
        if args.command == "read":
            await client.mark_read(args.conversation, args.seq)
            print(json.dumps(client.state.conversations[args.conversation].line()))
            return EXIT_OK
        for line in client.state.lines():
            print(json.dumps(line))
        return EXIT_OK
    finally:
        await client.close()
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code = asyncio.run(run(args))
    except FanoutClientError as exc:
        print(f"fanout-client: error: {exc}", file=sys.stderr)
        code = EXIT_BEHIND if isinstance(exc, NotCaughtUp) else EXIT_REFUSED
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
