"""Crash test (invariant X): kill -9 `fanout serve` at a named step of a 100k-member
fan-out (projections/failpoints.py), restart it, and every mailbox holds each message exactly
once, every count is exact, and the views equal a recomputation from the log.

Two steps of the embedded unit of work (adapters/sqlite/views.py): before the second
message's mailbox write (`commit.mailbox`: the mailbox holds the first message's entries,
strictly between none and all of what was sent), and between the mailbox write of a unit
and the views' commit of its tracking (`commit.tracking`: the mailbox holds a message the
views do not). Each run asserts that its kill landed there, read from the data directory
before the restart."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from domain.params import Parameters
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from fanout.security import load_or_create_secret, mint_token
from tools.rebuild import verify

pytestmark = pytest.mark.slow  # a 100k-member fan-out per case

MEMBERS = 100_000
SENDERS = ["u000001", "u000002", "u000003"]
MENTIONED = "u099999"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, failpoints: str = "") -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # the embedded runtime: engine URLs a caller's shell exports must not make it a replica
        env = {k: v for k, v in os.environ.items() if k not in ("FANOUT_EVENT_STORE", "FANOUT_LOG", "FANOUT_VIEWS")}
        env["FANOUT_DATA_DIR"] = str(data_dir)
        env["FANOUT_FAILPOINTS"] = failpoints
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--data-dir", str(data_dir), "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ''
                    raise RuntimeError(f"serve exited: {err}") from None
                time.sleep(0.05)
        raise RuntimeError("serve did not come up in 30 s")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def call(base: str, token: str, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding one 100k-member group, projected, server stopped."""
    d = tmp_path_factory.mktemp("crash-template")
    with bootstrap(Settings.embedded(d)) as rt:
        rt.app.create_conversation("acme", "big", "crash test", [f"u{i:06d}" for i in range(MEMBERS)])
        rt.runner.catch_up()
    load_or_create_secret(d, None)
    return d


def at_the_kill(data_dir: Path) -> tuple[collections.Counter[int], int]:
    """Read from the data directory of a killed server, before any restart: the mailbox
    entries per seq, and the seq up to which the views' delivery records are materialized."""
    from adapters.rocksdb.mailbox import RocksMailbox

    mailbox = RocksMailbox(data_dir / "mailbox.rocksdb")
    try:
        per_seq = collections.Counter(seq for _t, _u, _pos, seq, _c, _f in mailbox.all_entries())
    finally:
        mailbox.close()
    with sqlite3.connect(data_dir / "views.sqlite") as con:
        row = con.execute(
            "SELECT max(conversation_seq) FROM delivery WHERE conversation_id='big' AND materialized_at IS NOT NULL"
        ).fetchone()
    return per_seq, int(row[0] or 0)


@pytest.mark.parametrize("point", ["commit.mailbox", "commit.tracking"])
def test_kill_9_during_a_100k_member_fanout_loses_and_duplicates_nothing(
    template: Path, tmp_path: Path, point: str
) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(template, data_dir)
    secret = load_or_create_secret(data_dir, None)
    token = mint_token(secret, "acme", "service", "crash-test")
    admin = mint_token(secret, "acme", "admin", "crash-test")

    server = Server(data_dir, failpoints=f"{point}=kill@MessageSent#2")
    acked: list[dict[str, Any]] = []
    sent = 0

    def send_all() -> None:
        nonlocal sent
        for i, sender in enumerate(SENDERS):
            body = {"sender": sender, "text": f"{point} message {i}", "client_msg_id": f"{point}-{i}"}
            if i == 0:
                body["mentions"] = [MENTIONED]
            try:
                status, r = call(server.base, token, "POST", "/v1/conversations/big/messages", body)
            except OSError:
                return  # the server died under us: not acknowledged
            sent += 1
            if status == 201:
                acked.append(r)
            time.sleep(0.55)  # the large bucket admits 2 msg/s

    sender = threading.Thread(target=send_all)
    sender.start()
    assert server.proc.wait(60) == -signal.SIGKILL, "the failpoint did not kill the server"
    sender.join()
    per_seq, materialized = at_the_kill(data_dir)
    entries = sum(per_seq.values())
    if point == "commit.mailbox":  # before the second message's entries: the first's are there
        assert 0 < entries < max(sent, 2) * MEMBERS, (point, dict(per_seq), sent)
    else:  # the mailbox holds a message whose delivery the views have not committed
        assert per_seq and max(per_seq) > materialized and per_seq[max(per_seq)] == MEMBERS, (per_seq, materialized)

    server = Server(data_dir)  # restart: the projector resumes from its tracking position
    try:
        deadline = time.monotonic() + 60
        while True:  # wait for the projector to hold the whole log (lag 0), not for a sleep
            status, proj = call(server.base, admin, "GET", "/v1/admin/projections")
            if status == 200 and proj["projections"] and all(p["lag"] == 0 for p in proj["projections"]):
                break
            assert time.monotonic() < deadline, f"projections did not catch up: {proj}"
            time.sleep(0.05)
        status, head = call(server.base, token, "GET", "/v1/conversations/big")
        assert status == 200
        latest = head["latest_conversation_seq"]
        # Every acknowledged message survived the crash (nothing lost).
        assert latest >= len(acked)
        for seq in range(1, latest + 1):
            deadline = time.monotonic() + 60
            while True:
                status, rec = call(server.base, token, "GET", f"/v1/conversations/big/messages/{seq}/delivery")
                if status == 200 and rec["materialized_at"] is not None:
                    break
                assert time.monotonic() < deadline, f"message {seq} not materialized after restart"
                time.sleep(0.05)
            assert rec["mailbox_entries"] == MEMBERS
    finally:
        server.stop()

    with bootstrap(Settings.embedded(data_dir)) as rt:
        stored = {m["message_id"]: m["conversation_seq"] for m in rt.views.messages("acme", "big", 0, 100)}
        assert {a["message_id"] for a in acked} <= set(stored)
        # Exactly one mailbox entry per member per message, no more, no fewer.
        per_seq: collections.Counter[int] = collections.Counter()
        seen: set[tuple[str, int]] = set()
        for tenant, user, _pos, seq, cid, _flags in rt.views.mailbox.all_entries():
            assert (tenant, cid) == ("acme", "big")
            assert (user, seq) not in seen, f"duplicate mailbox entry for {user} seq {seq}"
            seen.add((user, seq))
            per_seq[seq] += 1
        assert dict(per_seq) == {seq: MEMBERS for seq in range(1, latest + 1)}
        # Counts are exact: unread and mention counts of every member.
        senders_of = {seq: m["sender"] for m in rt.views.messages("acme", "big", 0, 100) for seq in [m["conversation_seq"]]}
        mentioned_in = [m["conversation_seq"] for m in rt.views.messages("acme", "big", 0, 100) if MENTIONED in m["mentions"]]
        for user in ["u000000", *SENDERS, MENTIONED]:
            sessions, _ = rt.queries.session_list("acme", user)
            (s,) = sessions
            own = [seq for seq, snd in senders_of.items() if snd == user]
            read = max(own, default=0)
            assert s["read_conversation_seq"] == read
            assert s["unread_count"] == latest - read and s["unread_exact"]
            assert s["mention_count"] == len([q for q in mentioned_in if q > read and user == MENTIONED])
        con = rt.views.reader()
        assert con.execute("SELECT count(*) FROM states WHERE conversation_id='big'").fetchone()[0] == MEMBERS

    # The views equal a recomputation from the log, table by table and key by key.
    result = verify(Settings.embedded(data_dir, Parameters()), progress=False)
    assert result.equal, result.differences
