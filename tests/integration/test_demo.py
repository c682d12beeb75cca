"""`fanout demo` with a 2000-member group: the story's numbers, not its text."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli.demo import DemoError, run_demo
from domain.params import Parameters
from fanout.config import Settings
from tools.rebuild import verify

MEMBERS = 2000
PARAMS = Parameters()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("demo") / "data"
    return data_dir, run_demo(data_dir, MEMBERS, params=PARAMS, out=io.StringIO())


def test_the_final_counts_converge_to_the_exact_values(demo: tuple[Path, dict[str, Any]]) -> None:
    _, summary = demo
    assert summary["converged"] is True
    for label, c in summary["final"].items():
        assert c["mention_count"] == c["expected_mentions"], label  # exact in every policy (M)
        assert c["unread_count"] == c["expected_unread"], label
    for label in ("admin", "active", "silent", "silent+@"):
        assert summary["final"][label]["unread_exact"] is True, label


def test_mailbox_entries_drop_to_active_plus_mentioned_in_mention_only(demo: tuple[Path, dict[str, Any]]) -> None:
    _, summary = demo
    cost = summary["cost"]
    always = [c for c in cost if c["policy"] == "always"]
    mention_only = [c for c in cost if c["policy"] == "mention_only"]
    assert always and mention_only
    assert all(c["mailbox_entries"] == MEMBERS for c in always)
    active = summary["active_members"]
    plain = [c for c in mention_only if c["kind"] == "plain"]
    mentioned = [c for c in mention_only if c["kind"] == "mention"]
    # active members include the senders; + 1 for a mentioned silent member
    assert {c["mailbox_entries"] for c in plain} == {active + 1}
    assert {c["mailbox_entries"] for c in mentioned} == {active + 2}
    assert all(c["materialized"] for c in cost)
    # online devices are pushed to in every policy
    assert {c["online_pushes"] for c in cost} == {summary["online_devices"]}


def test_the_switch_and_rollback_follow_the_review(demo: tuple[Path, dict[str, Any]]) -> None:
    _, summary = demo
    assert summary["size_bucket"] == "medium"
    assert summary["alpha"] < 0.1
    assert summary["switched_at_seq"] == 5
    assert [c["policy"] for c in summary["cost"]] == ["always"] * 5 + ["mention_only"] * 3 + ["always"]


def test_the_silent_session_flags_its_gap_and_pull_history_closes_it(demo: tuple[Path, dict[str, Any]]) -> None:
    _, summary = demo
    active = summary["sessions_mention_only"]["active"]
    silent = summary["sessions_mention_only"]["silent"]
    assert active["unread_exact"] is True
    assert silent["unread_exact"] is False
    assert silent["delivered_conversation_seq"] == 5
    assert silent["latest_conversation_seq"] == 8
    assert summary["history_gap_closed"] is True
    after = summary["sessions_after_rollback"]["silent"]
    assert after["unread_exact"] is False and after["write_policy"] == "always"


def test_the_demo_leaves_views_that_equal_the_log(demo: tuple[Path, dict[str, Any]]) -> None:
    data_dir, _ = demo
    assert verify(Settings.embedded(data_dir, PARAMS), progress=False).equal


def test_the_demo_refuses_a_non_empty_data_dir_unless_forced(demo: tuple[Path, dict[str, Any]]) -> None:
    data_dir, _ = demo
    with pytest.raises(DemoError, match="not empty"):
        run_demo(data_dir, 200, params=PARAMS, out=io.StringIO())
    again = run_demo(data_dir, 200, params=PARAMS, force=True, out=io.StringIO())
    assert again["converged"] and again["members"] == 200


def test_fanout_demo_runs_from_the_command_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "demo", "--members", "500", "--data-dir", str(tmp_path / "d")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "converged: True" in r.stdout
