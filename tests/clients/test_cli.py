"""`fanout-client`, the console script, as a subprocess against a real `fanout serve`: the
output's shape, the exit codes, and the SQLite state file carried from one process to the next."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from fanout_client import SqliteStore

from fanout.security import mint_token
from tests.clients.conftest import ServeProcess, sdk_env
from tests.e2e.conftest import SECRET, Api, conversation, expect

SCRIPT = Path(sys.executable).parent / "fanout-client"
KEYS = [
    "conversation_id",
    "latest_seq",
    "read_seq",
    "unread",
    "unread_exact",
    "mentions",
    "write_policy",
    "held",
    "gaps",
]


def fanout_client(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), f"{SCRIPT} is missing: `make install` installs clients/python into the venv"
    return subprocess.run([str(SCRIPT), *args], env=sdk_env(), capture_output=True, text=True, timeout=timeout)


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("fanout-client: error: "), line
    return line


async def test_sync_prints_one_line_per_conversation_and_the_state_file_outlives_the_process(
    api: Api, served: ServeProcess, tmp_path: Path
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    svc = await conversation(api, tenant, a, ["ann", "bob"])
    await conversation(api, tenant, b, ["ann", "bob"])
    for i in range(3):
        expect(await svc.send(a, sender="ann", text=f"a{i} @bob", mentions=["bob"] if i == 2 else []), 201)
    expect(await svc.send(b, sender="ann", text="b0"), 201)
    await svc.materialized(a, 3)
    await svc.materialized(b, 1)
    token, state = mint_token(SECRET, tenant, "user", "bob"), tmp_path / "bob.db"
    common = ("--url", served.url, "--token", token, "--state", str(state))

    r = fanout_client("sync", *common)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    first = lines(r.stdout)
    assert [list(line) for line in first] == [KEYS, KEYS]
    assert first == [
        {"conversation_id": a, "latest_seq": 3, "read_seq": 0, "unread": 3, "unread_exact": True, "mentions": 1,
         "write_policy": "always", "held": [[1, 3]], "gaps": []},
        {"conversation_id": b, "latest_seq": 1, "read_seq": 0, "unread": 1, "unread_exact": True, "mentions": 0,
         "write_policy": "always", "held": [[1, 1]], "gaps": []},
    ]  # fmt: skip
    stored = SqliteStore(state).load()  # another process reads the file the command left
    assert stored.cursor > 0 and stored.lines() == first
    cursor = stored.cursor

    for i in range(5):
        expect(await svc.send(a, sender="ann", text=f"later {i}"), 201)
    await svc.materialized(a, 8)
    r = fanout_client("sync", *common)
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout)[0]["held"] == [[1, 8]] and SqliteStore(state).load().cursor > cursor

    r = fanout_client("read", *common, "--conversation", a, "--seq", "5")
    assert r.returncode == 0, r.stderr
    (line,) = lines(r.stdout)
    assert list(line) == KEYS and (line["read_seq"], line["unread"], line["mentions"]) == (5, 3, 0)
    r = fanout_client("read", *common, "--conversation", a)  # to the latest held
    (line,) = lines(r.stdout)
    assert (line["read_seq"], line["unread"], line["unread_exact"]) == (8, 0, True)


async def test_sync_follow_applies_live_frames_for_the_seconds_given(
    api: Api, served: ServeProcess, tmp_path: Path
) -> None:
    tenant, cid = f"t-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:6]}"
    svc = await conversation(api, tenant, cid, ["ann", "bob"])
    token = mint_token(SECRET, tenant, "user", "bob")
    args = [str(SCRIPT), "sync", "--url", served.url, "--token", token, "--state", str(tmp_path / "s.db")]
    proc = subprocess.Popen([*args, "--follow", "3"], env=sdk_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 20
    while not (tmp_path / "s.db").exists() or SqliteStore(tmp_path / "s.db").load().user_id is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        await asyncio.sleep(0.05)  # until the command has synced (it stores the identity then): live from now
    expect(await svc.send(cid, sender="ann", text="live"), 201)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert lines(out)[0]["held"] == [[1, 1]]


def test_a_refused_token_is_exit_2_with_one_line(served: ServeProcess, tmp_path: Path) -> None:
    service_token = mint_token(SECRET, "acme", "service", "bot")  # not a user token: FORBIDDEN
    r = fanout_client("sync", "--url", served.url, "--token", service_token, "--state", str(tmp_path / "s.db"))
    assert r.returncode == 2 and r.stdout == ""
    assert "FORBIDDEN" in one_error_line(r)
    r = fanout_client("sync", "--url", served.url, "--token", "not-a-jwt", "--state", str(tmp_path / "s.db"))
    assert r.returncode == 2 and "UNAUTHENTICATED" in one_error_line(r)


def test_a_server_out_of_reach_is_exit_1_with_one_line(tmp_path: Path) -> None:
    from tests.integration.test_cli import free_port

    url = f"http://127.0.0.1:{free_port()}"
    r = fanout_client("sync", "--url", url, "--token", "x", "--state", str(tmp_path / "s.db"), "--timeout", "1.5")
    assert r.returncode == 1 and r.stdout == ""
    assert "not caught up" in one_error_line(r)


def test_help_names_the_commands_the_keys_and_the_exit_codes() -> None:
    r = fanout_client("--help")
    assert r.returncode == 0
    for word in ("sync", "read", "unread_exact", "held", "gaps", "exit status", "example"):
        assert word in r.stdout, word
    r = fanout_client("read", "--help")
    assert r.returncode == 0 and "--conversation" in r.stdout and "--seq" in r.stdout
