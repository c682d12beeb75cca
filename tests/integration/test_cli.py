"""The `fanout` command line, run as a subprocess against real data dirs."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jwt
import pytest

from cli.demo import run_demo
from domain.params import Parameters
from fanout.bootstrap import DataDirLock
from fanout.config import Settings
from tools.replay import event_types

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("serve", "token", "replay", "rebuild", "verify", "analyze", "demo", "worker", "relay")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    env.update(extra)
    return env


def fanout(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=REPO,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("cli") / "data"
    run_demo(data_dir, 400, params=Parameters(), out=io.StringIO())
    return data_dir


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- help ----------------------------------------------------------------------------


def test_top_level_help_lists_every_command_with_examples() -> None:
    r = fanout("--help")
    assert r.returncode == 0
    for cmd in COMMANDS:
        assert cmd in r.stdout
    assert "examples:" in r.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_the_common_options_and_an_example(command: str) -> None:
    r = fanout(command, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: fanout {command}")
    assert "--data-dir" in r.stdout and "--config" in r.stdout
    assert f"example:\n  fanout {command}" in r.stdout


# -- configuration errors ------------------------------------------------------------


def test_a_bad_setting_stops_with_one_line_naming_the_variable(tmp_path: Path) -> None:
    r = fanout("analyze", "capacity", "--data-dir", str(tmp_path), env=clean_env(FANOUT_MAX_GROUP_MEMBERS="lots"))
    assert r.returncode == 2
    assert r.stderr.startswith("fanout: error: FANOUT_MAX_GROUP_MEMBERS=")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_bad_duration_in_a_config_file_names_the_variable(tmp_path: Path) -> None:
    config = tmp_path / "fanout.toml"
    config.write_text('policy_switch_min_interval = "soon"\n')
    r = fanout("replay", "--data-dir", str(tmp_path), "--config", str(config))
    assert r.returncode == 2
    assert "FANOUT_POLICY_SWITCH_MIN_INTERVAL" in r.stderr


def test_a_busy_data_dir_stops_rebuild_with_exit_2(scenario: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(scenario, data_dir)
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        r = fanout("rebuild", "all", "--data-dir", str(data_dir))
    finally:
        lock.release()
    assert r.returncode == 2
    assert r.stderr.startswith("fanout: error:") and "in use" in r.stderr


def test_the_data_dir_defaults_to_FANOUT_DATA_DIR(scenario: Path) -> None:
    r = fanout("analyze", "capacity", env=clean_env(FANOUT_DATA_DIR=str(scenario)))
    assert r.returncode == 0, r.stderr
    assert "T1" in r.stdout


# -- token -----------------------------------------------------------------------------


def test_token_without_a_secret_says_how_to_get_one(tmp_path: Path) -> None:
    r = fanout("token", "--tenant", "acme", "--role", "user", "--sub", "alice", "--data-dir", str(tmp_path))
    assert r.returncode == 2
    assert "fanout: error:" in r.stderr and "secret" in r.stderr


def test_token_signs_with_the_secret_the_server_created(tmp_path: Path) -> None:
    from fanout.security import load_or_create_secret, verify_token

    secret = load_or_create_secret(tmp_path, None)  # what `fanout serve` does on first start
    r = fanout(
        "token", "--tenant", "acme", "--role", "admin", "--sub", "ops", "--ttl", "1h", "--data-dir", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    claims = verify_token(secret, token)
    assert (claims.tenant, claims.role, claims.sub) == ("acme", "admin", "ops")
    assert 3500 < claims.exp - time.time() <= 3600


def test_token_uses_FANOUT_SECRET_when_set(tmp_path: Path) -> None:
    r = fanout(
        "token", "--tenant", "t1", "--role", "service", "--sub", "bot", "--data-dir", str(tmp_path),
        env=clean_env(FANOUT_SECRET="s3cret-for-tests-0123456789abcdef"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    claims = jwt.decode(r.stdout.strip(), "s3cret-for-tests-0123456789abcdef", algorithms=["HS256"])
    assert claims["tenant"] == "t1" and claims["role"] == "service"


def test_token_rejects_an_unknown_role(tmp_path: Path) -> None:
    r = fanout("token", "--tenant", "t", "--role", "root", "--sub", "x", "--data-dir", str(tmp_path))
    assert r.returncode == 2
    assert "invalid choice" in r.stderr


# -- replay ----------------------------------------------------------------------------


def test_replay_writes_one_parseable_line_per_event_in_log_order(scenario: Path) -> None:
    r = fanout("replay", "--data-dir", str(scenario), "--quiet")
    assert r.returncode == 0, r.stderr
    lines = jsonl(r.stdout)
    positions = [x["position"] for x in lines]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for x in lines:
        assert {"position", "type", "originator_id", "version", "timestamp"} <= set(x)
    sent = [x for x in lines if x["type"] == "Conversation.MessageSent"]
    assert sent and all(x["tenant"] == "demo" and "conversation_id" in x and "seq" in x for x in sent)
    types = {x["type"] for x in lines}
    assert {"Conversation.Created", "Conversation.WritePolicyChanged", "Review.Decided", "Tier.RolledBack"} <= types


def test_replay_filters_by_type_conversation_and_tenant(scenario: Path) -> None:
    r = fanout(
        "replay", "--data-dir", str(scenario), "-q", "--type", "MessageSent,MemberReadState.Created",
        "--conversation", "all-hands", "--tenant", "demo",
    )  # fmt: skip
    lines = jsonl(r.stdout)
    assert lines
    # A member's reads are in a stream of its own that names its conversation (ADR-0018).
    assert {x["type"] for x in lines} == {"Conversation.MessageSent", "MemberReadState.Created"}
    assert {x["conversation_id"] for x in lines} == {"all-hands"}
    assert [x["seq"] for x in lines if x["type"] == "Conversation.MessageSent"] == list(range(1, 10))

    other = fanout("replay", "--data-dir", str(scenario), "-q", "--tenant", "nobody")
    assert other.returncode == 2 and other.stdout == ""  # an unknown tenant is an error, not 0 events


def test_replay_filters_by_time_and_position_and_writes_a_file(scenario: Path, tmp_path: Path) -> None:
    everything = jsonl(fanout("replay", "--data-dir", str(scenario), "-q").stdout)
    middle = everything[len(everything) // 2]

    since = jsonl(fanout("replay", "--data-dir", str(scenario), "-q", "--since", middle["timestamp"]).stdout)
    assert since and all(x["timestamp"] >= middle["timestamp"] for x in since)
    assert middle in since

    until_epoch = str(time.time() - 365 * 86400)
    assert jsonl(fanout("replay", "--data-dir", str(scenario), "-q", "--until", until_epoch).stdout) == []

    out = tmp_path / "events.jsonl"
    r = fanout("replay", "--data-dir", str(scenario), "--from-position", str(middle["position"]), "--out", str(out))
    assert r.returncode == 0, r.stderr
    from_middle = jsonl(out.read_text())
    assert from_middle[0]["position"] == middle["position"]
    assert from_middle == [x for x in everything if x["position"] >= middle["position"]]
    assert f"replayed {len(from_middle)} events" in r.stderr


def test_replay_from_a_later_position_still_resolves_tenant_and_conversation(scenario: Path) -> None:
    everything = jsonl(fanout("replay", "--data-dir", str(scenario), "-q").stdout)
    last_sent = [x for x in everything if x["type"] == "Conversation.MessageSent"][-1]
    r = fanout("replay", "--data-dir", str(scenario), "-q", "--from-position", str(last_sent["position"]))
    first = jsonl(r.stdout)[0]
    assert first["tenant"] == "demo" and first["conversation_id"] == last_sent["conversation_id"]


def test_replay_runs_while_the_data_dir_is_locked(scenario: Path) -> None:
    lock = DataDirLock(scenario)
    lock.acquire()
    try:
        r = fanout("replay", "--data-dir", str(scenario), "-q", "--type", "Created")
    finally:
        lock.release()
    assert r.returncode == 0, r.stderr
    assert jsonl(r.stdout)


def test_replay_rejects_a_bad_time(scenario: Path) -> None:
    r = fanout("replay", "--data-dir", str(scenario), "--since", "yesterday")
    assert r.returncode == 2 and "yesterday" in r.stderr


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[:300], r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fanout: error:"), r.stderr
    return lines[0]


def test_replay_of_an_unknown_event_type_is_an_error_listing_the_types(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    line = one_error_line(fanout("replay", "--data-dir", str(scenario), "--type", "MessageSend", "--out", str(out)))
    assert "MessageSend" in line and "Conversation.MessageSent" in line and "Tier.RolledBack" in line
    assert "did you mean MessageSent" in line
    assert not out.exists()  # refused before anything is written
    # one bad name among good ones is still an error; qualified and short names both work
    line = one_error_line(fanout("replay", "--data-dir", str(scenario), "--type", "MessageSent,Conversation.Nope"))
    assert "Conversation.Nope" in line
    r = fanout("replay", "--data-dir", str(scenario), "-q", "--type", "Review.Decided,RolledBack")
    assert r.returncode == 0 and {x["type"] for x in jsonl(r.stdout)} == {"Review.Decided", "Tier.RolledBack"}
    # the listed types are the ones the log holds
    logged = {x["type"] for x in jsonl(fanout("replay", "--data-dir", str(scenario), "-q").stdout)}
    assert logged <= set(event_types())


def test_replay_of_an_unknown_tenant_is_an_error_listing_the_tenants(scenario: Path) -> None:
    line = one_error_line(fanout("replay", "--data-dir", str(scenario), "--tenant", "nobody"))
    assert "nobody" in line and "demo" in line


def test_replay_of_an_unknown_conversation_is_an_error_listing_the_conversations(scenario: Path) -> None:
    line = one_error_line(fanout("replay", "--data-dir", str(scenario), "--conversation", "all-hand"))
    assert "all-hand" in line and "all-hands" in line
    # known conversation, other tenant: not there either
    line = one_error_line(fanout("replay", "--data-dir", str(scenario), "--conversation", "all-hands", "--tenant", "x"))
    assert "tenant" in line and "demo" in line


def test_replay_lists_at_most_a_few_names_and_says_how_many_more(tmp_path: Path) -> None:
    from fanout.bootstrap import bootstrap

    data_dir = tmp_path / "data"
    with bootstrap(Settings.embedded(data_dir)) as rt:
        for i in range(30):
            rt.app.create_conversation("acme", f"room-{i:02d}", "", ["ann"])
    line = one_error_line(fanout("replay", "--data-dir", str(data_dir), "--conversation", "lobby"))
    assert "room-00" in line and "room-29" not in line and "and 20 more" in line, line


def test_replay_output_is_strict_json_or_a_clear_error(tmp_path: Path) -> None:
    """A non-finite number stored in the log (possible before the API refused them) is an
    error naming the event, never an `Infinity` in the JSONL."""
    from fanout.bootstrap import bootstrap

    data_dir = tmp_path / "data"
    with bootstrap(Settings.embedded(data_dir)) as rt:
        rt.app.create_conversation("acme", "general", "", ["ann"])
        rt.app.open_review("acme", "small", "manual", {"load": float("inf")}, "ops")
    r = fanout("replay", "--data-dir", str(data_dir), "-q")
    assert r.returncode == 2 and "Infinity" not in r.stdout, r.stdout
    for line in r.stdout.splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert "Review.Opened" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = fanout("replay", "--data-dir", str(data_dir), "-q", "--type", "Conversation.Created")
    assert r.returncode == 0 and len(jsonl(r.stdout)) == 1


# -- analyze ----------------------------------------------------------------------------


def test_analyze_alpha_prints_the_bucket_table_and_writes_a_png(scenario: Path, tmp_path: Path) -> None:
    png = tmp_path / "alpha.png"
    r = fanout(
        "analyze", "alpha", "--data-dir", str(scenario), "--tenant", "demo",
        "--min-saving", "100", "--max-active-ratio", "0.1", "--png", str(png),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[2:5]}
    assert set(rows) == {"small", "medium", "large"}
    # the 400-member group is small (<= 1000): 2 small groups + it; it meets the criterion
    assert rows["small"][1] == "3"
    assert int(rows["small"][8]) >= 1


def test_analyze_alpha_json_evaluates_the_criterion(scenario: Path) -> None:
    r = fanout(
        "analyze", "alpha", "--data-dir", str(scenario), "--json", "--min-saving", "100", "--max-active-ratio", "0.1"
    )
    report = json.loads(r.stdout)
    small = next(b for b in report["buckets"] if b["size_bucket"] == "small")
    big = next(c for c in small["per_conversation"] if c["conversation_id"] == "all-hands")
    assert big["members"] == 400 and big["meets"] is True
    assert big["saving"] == pytest.approx(400 * (1 - big["alpha"]))


def test_analyze_alpha_needs_both_review_parameters(scenario: Path) -> None:
    r = fanout("analyze", "alpha", "--data-dir", str(scenario), "--min-saving", "100")
    assert r.returncode == 2 and "--max-active-ratio" in r.stderr


def test_analyze_capacity_shows_entries_per_second_and_t1_t2(scenario: Path) -> None:
    r = fanout("analyze", "capacity", "--data-dir", str(scenario), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["messages_total"] == 12  # 9 to all-hands, 3 to the small groups
    assert set(report["T1"]) == {"limit", "over", "firing"}


# -- serve ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_answers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--data-dir", str(data_dir), "--port", str(port)],
        cwd=REPO,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.communicate()[1]) from None
                time.sleep(0.2)
        assert (data_dir / "secret").exists()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"serving http://127.0.0.1:{port}" in out and "fanout token" in out
    # the lock is released: another process can take the data dir
    lock = DataDirLock(data_dir)
    lock.acquire()
    lock.release()
    r = fanout("token", "--tenant", "a", "--role", "user", "--sub", "u", "--data-dir", str(data_dir))
    assert r.returncode == 0 and r.stdout.count(".") == 2


def test_serve_on_a_port_in_use_is_one_line_naming_it_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = fanout("serve", "--data-dir", str(tmp_path / "data"), "--port", str(port), timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert "serving" not in r.stdout, r.stdout  # nothing claims to serve before the bind
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("fanout: error:") and f"127.0.0.1:{port}" in lines[0], lines[0]
    assert "in use" in lines[0], lines[0]
    assert not (tmp_path / "data").exists()  # bound before the data dir was opened (or created)


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_on_an_impossible_port_is_one_line(tmp_path: Path, port: str) -> None:
    r = fanout("serve", "--data-dir", str(tmp_path / "data"), "--port", port, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert port in r.stderr
