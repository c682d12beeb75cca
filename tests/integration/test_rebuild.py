"""`fanout rebuild` and `fanout verify` on real files: the SQLite event store and
views and the RocksDB mailbox of a data dir written by the demo scenario (sends in
always and mention_only, gaps, MARK_READ, REBUILD, a review, a tier rollback)."""

from __future__ import annotations

import io
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters.rocksdb.mailbox import RocksMailbox
from cli.demo import run_demo
from domain.params import Parameters
from fanout.bootstrap import DataDirBusy, DataDirLock
from fanout.config import Settings
from projections.ports import MessageRefs
from tools.rebuild import rebuild, verify

PARAMS = Parameters()
TABLES = ("heads", "messages", "states", "delivery", "reviews", "tiers")
RUNTIME_COLUMNS = {"materialized_at", "online_pushes"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("scenario") / "data"
    summary = run_demo(data_dir, 600, params=PARAMS, out=io.StringIO())
    assert summary["converged"]
    return data_dir


@pytest.fixture
def data_dir(scenario: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(scenario, copy)
    return copy


def capture(data_dir: Path, *, with_runtime_facts: bool = False) -> dict[str, Any]:
    """Every views table (sorted rows) and the mailbox entry set."""
    out: dict[str, Any] = {}
    con = sqlite3.connect(data_dir / "views.sqlite")
    try:
        for table in TABLES:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            keep = [c for c in cols if with_runtime_facts or c not in RUNTIME_COLUMNS]
            out[table] = sorted(con.execute(f"SELECT {', '.join(keep)} FROM {table}").fetchall(), key=repr)
        out["tracking"] = con.execute("SELECT * FROM tracking").fetchall()
    finally:
        con.close()
    mailbox = RocksMailbox(data_dir / "mailbox.rocksdb", PARAMS.mailbox_shards)
    try:
        out["mailbox"] = list(mailbox.all_entries())
    finally:
        mailbox.close()
    return out


def drop_views_files(data_dir: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{data_dir / 'views.sqlite'}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(data_dir / "mailbox.rocksdb")


def test_the_scenario_has_something_to_rebuild(scenario: Path) -> None:
    live = capture(scenario)
    assert len(live["mailbox"]) > 600 * 5
    # gaps exist: some member states carry a delivered_conversation_seq
    con = sqlite3.connect(scenario / "views.sqlite")
    assert con.execute("SELECT count(*) FROM states WHERE delivered_conversation_seq IS NOT NULL").fetchone()[0] > 0
    con.close()


def test_rebuild_all_after_deleting_the_views_equals_the_views_before(data_dir: Path) -> None:
    before = capture(data_dir)
    drop_views_files(data_dir)

    result = rebuild(Settings.embedded(data_dir, PARAMS), "all", progress=False)

    assert capture(data_dir) == before
    assert result.rows["mailbox"] == len(before["mailbox"])
    assert result.rows["states"] == len(before["states"])
    assert not any(p.name.startswith("rebuild-") for p in data_dir.iterdir())


def test_rebuild_all_over_live_views_keeps_delivery_runtime_facts(data_dir: Path) -> None:
    before = capture(data_dir, with_runtime_facts=True)

    rebuild(Settings.embedded(data_dir, PARAMS), "all", progress=False)

    assert capture(data_dir, with_runtime_facts=True) == before


def test_rebuild_mailbox_restores_a_deleted_mailbox(data_dir: Path) -> None:
    before = capture(data_dir, with_runtime_facts=True)
    shutil.rmtree(data_dir / "mailbox.rocksdb")

    result = rebuild(Settings.embedded(data_dir, PARAMS), "mailbox", progress=False)

    assert capture(data_dir, with_runtime_facts=True) == before
    assert set(result.rows) == {"mailbox"}


def test_rebuild_state_restores_deleted_member_states(data_dir: Path) -> None:
    before = capture(data_dir, with_runtime_facts=True)
    con = sqlite3.connect(data_dir / "views.sqlite")
    con.execute("DELETE FROM states")
    con.commit()
    con.close()

    result = rebuild(Settings.embedded(data_dir, PARAMS), "state", progress=False)

    assert capture(data_dir, with_runtime_facts=True) == before
    assert set(result.rows) == {"states"}


def test_rebuild_heads_restores_heads_messages_delivery_reviews_tiers_and_keeps_runtime_facts(data_dir: Path) -> None:
    before = capture(data_dir, with_runtime_facts=True)
    con = sqlite3.connect(data_dir / "views.sqlite")
    for table in ("heads", "messages", "delivery", "reviews", "tiers"):
        con.execute(f"DELETE FROM {table}")
    con.commit()
    con.close()

    rebuild(Settings.embedded(data_dir, PARAMS), "heads", progress=False)

    after = capture(data_dir, with_runtime_facts=True)
    for table in ("heads", "messages", "reviews", "tiers", "states", "mailbox", "tracking"):
        assert after[table] == before[table], table
    # the delivery rows were deleted, so their runtime facts could not be carried over
    assert capture(data_dir)["delivery"] == capture_without_facts(before["delivery"])


def capture_without_facts(rows: list[Any]) -> list[Any]:
    # delivery columns: ..., pos, online_pushes, materialized_at (the last two are runtime facts)
    return sorted((r[:-2] for r in rows), key=repr)


def test_rebuild_heads_keeps_the_runtime_facts_of_existing_delivery_rows(data_dir: Path) -> None:
    before = capture(data_dir, with_runtime_facts=True)
    assert any(r[-2] for r in before["delivery"]), "the scenario has online pushes"
    con = sqlite3.connect(data_dir / "views.sqlite")
    con.execute("DELETE FROM heads")
    con.commit()
    con.close()

    rebuild(Settings.embedded(data_dir, PARAMS), "heads", progress=False)

    assert capture(data_dir, with_runtime_facts=True) == before


def test_rebuild_refuses_a_data_dir_in_use(data_dir: Path) -> None:
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        with pytest.raises(DataDirBusy):
            rebuild(Settings.embedded(data_dir, PARAMS), "all", progress=False)
    finally:
        lock.release()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_verify_exits_0_on_a_healthy_data_dir(data_dir: Path) -> None:
    r = run_cli("verify", "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "views equal the log" in r.stdout


def test_verify_exits_1_after_one_state_row_is_corrupted(data_dir: Path) -> None:
    con = sqlite3.connect(data_dir / "views.sqlite")
    con.execute(
        "UPDATE states SET read_conversation_seq = read_conversation_seq + 1 WHERE tenant='demo' AND user_id='u000009' AND conversation_id='all-hands'"
    )
    assert con.total_changes == 1
    con.commit()
    con.close()

    r = run_cli("verify", "--data-dir", str(data_dir), "--limit", "3")

    assert r.returncode == 1, r.stdout + r.stderr
    assert "states" in r.stdout and "DIFFERS: 1 live-only, 1 recomputed-only" in r.stdout


def test_verify_finds_a_spurious_mailbox_entry(data_dir: Path) -> None:
    mailbox = RocksMailbox(data_dir / "mailbox.rocksdb", PARAMS.mailbox_shards)
    mailbox.write("demo", MessageRefs("all-hands", 999_999, 999, 0, {}, {0: ["u000007"]}))
    mailbox.close()

    result = verify(Settings.embedded(data_dir, PARAMS), progress=False)

    assert not result.equal
    assert set(result.differences) == {"mailbox"}
    assert result.counts["mailbox"] == (1, 0)
    assert result.differences["mailbox"][0][0][:3] == ("demo", "u000007", 999_999)


def test_verify_after_rebuild_all_is_clean(data_dir: Path) -> None:
    drop_views_files(data_dir)
    rebuild(Settings.embedded(data_dir, PARAMS), "all", progress=False)
    assert verify(Settings.embedded(data_dir, PARAMS), progress=False).equal
