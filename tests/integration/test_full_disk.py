"""A full disk, genuinely, without root: `fanout serve` runs as a subprocess and its
RLIMIT_FSIZE is lowered (`prlimit`) so every write that grows a file fails with EFBIG,
as it would with ENOSPC (CPython ignores SIGXFSZ). Sends are then 503 UNAVAILABLE
with Retry-After, never a 500; raising the limit again is space returning. Starting
on a full disk or an unusable data dir is one line on stderr and exit code 2.

Linux only (prlimit on another process): anywhere else these tests fail, they never skip."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from fanout.security import load_or_create_secret, mint_token
from tests.integration.test_cli import clean_env
from tests.integration.test_crash import free_port

REPO = Path(__file__).resolve().parents[2]
_, HARD_FSIZE = resource.getrlimit(resource.RLIMIT_FSIZE)


def call(base: str, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any, dict[str, str]]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null"), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null"), dict(err.headers)


class Serve:
    """`fanout serve` with its output drained by threads (so it can never block on a pipe)."""

    def __init__(self, data_dir: Path, nofile_soft: int | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"

        def limits() -> None:
            if nofile_soft is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile_soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--data-dir", str(data_dir), "--port", str(self.port)],
            cwd=REPO,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=limits,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=lambda s=stream, k=sink: k.extend(s), daemon=True).start()
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=1):
                    break
            except OSError:
                assert self.proc.poll() is None, "".join(self.err)
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.05)
        self.token = mint_token(load_or_create_secret(data_dir, None, create=False), "acme", "service", "svc")

    def disk_full(self, full: bool) -> None:
        resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE, (1 if full else HARD_FSIZE, HARD_FSIZE))

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
        return call(self.base, method, path, self.token, body)

    def materialized(self, cid: str, seq: int) -> None:
        deadline = time.monotonic() + 30
        while self.call("GET", f"/v1/conversations/{cid}/messages/{seq}/delivery")[1].get("materialized_at") is None:
            assert time.monotonic() < deadline, f"{cid}/{seq} not materialized"
            time.sleep(0.02)

    def stop(self) -> str:
        self.disk_full(False)
        self.proc.terminate()
        assert self.proc.wait(30) == 0
        return "".join(self.err)


def test_sends_on_a_full_disk_are_503_with_retry_after_and_recover_when_space_returns(tmp_path: Path) -> None:
    server = Serve(tmp_path / "data", nofile_soft=1024)
    try:
        assert any("open-file limit raised from 1024" in line for line in server.out) or (
            resource.getrlimit(resource.RLIMIT_NOFILE)[1] == 1024
        ), server.out
        assert server.call("POST", "/v1/conversations", {"conversation_id": "g", "members": ["ann", "bob"]})[0] == 201
        assert server.call("POST", "/v1/conversations/g/messages", {"sender": "ann", "text": "one"})[0] == 201
        server.materialized("g", 1)
        position = server.call("GET", "/readyz")[1]["log_position"]

        server.disk_full(True)
        for i in range(3):
            status, body, headers = server.call(
                "POST", "/v1/conversations/g/messages", {"sender": "bob", "text": f"{i}"}
            )
            assert status == 503, body
            assert body["error"] == "UNAVAILABLE" and set(body) == {"error", "message", "details"}
            assert body["details"]["reason"] in ("storage_full", "storage_error")
            assert body["details"]["retry_after_ms"] > 0 and int(headers["Retry-After"]) >= 1
        assert server.call("GET", "/readyz")[1]["log_position"] == position  # nothing half-written

        server.disk_full(False)
        status, body, _ = server.call("POST", "/v1/conversations/g/messages", {"sender": "bob", "text": "two"})
        assert status == 201 and body["conversation_seq"] == 2, body
        server.materialized("g", 2)
    finally:
        err = server.stop()
    assert "Traceback" not in err, err


def start(data_dir: Path, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    def limits() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, HARD_FSIZE))

    return subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--data-dir", str(data_dir), "--port", str(free_port())],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,  # pipes: the file-size limit does not apply to them
        text=True,
        timeout=60,
        preexec_fn=limits,
    )


def test_starting_on_a_full_disk_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = start(tmp_path / "data", fsize=0)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("fanout: error: cannot use ") and str(tmp_path / "data") in lines[0]
    assert "File too large" in lines[0] or "full" in lines[0], lines[0]


def test_starting_on_a_data_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("")
    r = start(not_a_dir)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"fanout: error: cannot use {not_a_dir}"), r.stderr


def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one() -> None:
    code = (
        "import resource; from fanout.overload import raise_fd_limit; "
        "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, h), h)); "
        "print(raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    target = min(hard, 1_048_576) if hard != resource.RLIM_INFINITY else 1_048_576
    assert out.strip() == f"({min(256, hard)}, {target}) ({target}, {hard})", out
    assert os.name == "posix"
