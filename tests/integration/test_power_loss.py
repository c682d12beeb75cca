"""The embedded runtime after a power loss or a kernel crash (ADR-0056), engine-free.

A power loss keeps what each store had made durable: the event store every commit (SQLite,
synchronous=FULL), the views (SQLite, synchronous=NORMAL) and the mailbox (RocksDB, no fsync)
a prefix of their commits each, not the same one. It is simulated with the files: a data dir
is copied while the runtime holds it open at two moments, S1 and S2 (a process image: what
the OS had been given), and a data dir is put together from the stores of either moment, or
the mailbox's write-ahead log of S2 is cut back to its length at S1 (its unsynced tail lost).
Then the runtime starts on it, and every mailbox must hold exactly the entries the run
without the power loss wrote, and `fanout verify` must find no difference; or the start is
refused with the line ADR-0056 documents, and the command it names repairs the data dir."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from adapters.rocksdb.mailbox import RocksMailbox
from domain.params import Parameters
from fanout.bootstrap import bootstrap
from fanout.bootstrap.power_loss import AheadOfTheLog
from fanout.clock import FakeClock
from fanout.config import Settings
from tools.rebuild import rebuild, verify

PARAMS = Parameters()
T = "t"
MEMBERS = [f"u{i:02d}" for i in range(30)]
MAILBOX = "mailbox.rocksdb"


def snapshot(data_dir: Path, to: Path) -> Path:
    """The data dir's files as the OS holds them right now (the runtime still open): the
    image a process crash leaves. The SQLite -shm index is rebuilt from the WAL on open."""
    shutil.copytree(data_dir, to, ignore=shutil.ignore_patterns("*-shm", "fanout.lock"))
    return to


def mailbox_entries(data_dir: Path) -> list[tuple[str, str, int, int, str, int]]:
    """The entries of a data dir's mailbox, read from a copy (opening RocksDB replays its
    log into a table file: the snapshots stay as they were taken)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = shutil.copytree(data_dir / MAILBOX, Path(scratch) / MAILBOX)
        mailbox = RocksMailbox(copy, PARAMS.mailbox_shards)
        try:
            return list(mailbox.all_entries())
        finally:
            mailbox.close()


@pytest.fixture(scope="module")
def moments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """S1: a conversation of 30 members and 4 messages, projected. S2: 3 more messages, a
    member joins, 3 more, a member leaves, 3 more, a second conversation with 2 messages
    (one mentioning a member), projected. The entries of S2 are what a run with no power
    loss holds; who received what is counted from the scenario, not from the code."""
    root = tmp_path_factory.mktemp("power_loss")
    live = root / "live"
    clock = FakeClock()
    rt = bootstrap(Settings.embedded(live, PARAMS), clock=clock)
    expected: Counter[str] = Counter()
    members = list(MEMBERS)

    def send(cid: str, sender: str, to: list[str], **kw: Any) -> None:
        clock.advance(3.0)  # past the per-sender rate
        rt.app.send_message(T, cid, sender=sender, text=f"from {sender}", **kw)
        expected.update(to)

    try:
        rt.app.create_conversation(T, "c", "", members)
        for i in range(4):
            send("c", members[i], members)
        rt.runner.catch_up()
        s1 = snapshot(live, root / "s1")
        s1_expected = Counter(expected)
        for i in range(3):
            send("c", members[i], members)
        rt.app.add_members(T, "c", ["late"])
        members.append("late")
        for i in range(3):
            send("c", members[i], members)
        rt.app.remove_member(T, "c", "u01")
        members.remove("u01")
        for i in range(3):
            send("c", members[i], members)
        rt.app.create_conversation(T, "d", "", MEMBERS[:10])
        send("d", "u00", MEMBERS[:10], mentions=["u05"])
        send("d", "u02", MEMBERS[:10])
        rt.runner.catch_up()
        s2 = snapshot(live, root / "s2")
        assert rt.views.mailbox.count() == sum(expected.values())
    finally:
        rt.close()
    entries = mailbox_entries(s2)
    assert Counter(e[1] for e in entries) == expected
    assert Counter(e[1] for e in mailbox_entries(s1)) == s1_expected
    return {"s1": s1, "s2": s2, "entries": entries, "expected": expected}


def put_together(to: Path, *, events: Path, views: Path, mailbox: Path) -> Path:
    """A data dir of the event store, the views and the mailbox of the given moments."""
    to.mkdir()
    for name in ("events.sqlite", "events.sqlite-wal", "views.sqlite", "views.sqlite-wal"):
        source = (events if name.startswith("events") else views) / name
        if source.exists():
            shutil.copy2(source, to / name)
    shutil.copytree(mailbox / MAILBOX, to / MAILBOX)
    return to


def start_and_settle(data_dir: Path) -> list[tuple[str, str, int, int, str, int]]:
    """`fanout serve`'s start (the check of ADR-0056 runs in it), the projector run to the
    end of the log, closed; the mailbox entries it leaves."""
    rt = bootstrap(Settings.embedded(data_dir, PARAMS), clock=FakeClock())
    try:
        rt.start()
        assert rt.wait_until(rt.log_position(), timeout=60)
        assert rt.last_error is None
    finally:
        rt.close()
    return mailbox_entries(data_dir)


def assert_whole(data_dir: Path, moments: dict[str, Any]) -> None:
    entries = start_and_settle(data_dir)
    assert entries == moments["entries"]  # the same keys and values as the run with no power loss
    per_user = Counter(e[1] for e in entries)
    assert per_user == moments["expected"]  # every member counted once per message they were there for
    assert len({(e[0], e[1], e[4], e[3]) for e in entries}) == len(entries)  # no message twice in a mailbox
    result = verify(Settings.embedded(data_dir, PARAMS), progress=False)
    assert result.equal, result.differences


def test_a_mailbox_that_lost_its_unsynced_tail_is_healed_at_start(
    moments: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The views of S2 were written back to disk, the mailbox's write-ahead log only as far
    as it was at S1: the views hold 11 messages whose entries the mailbox lost (293 entries), 6 of them
    after a join or a leave (the heal must fold the members as they were at each message)."""
    data_dir = put_together(tmp_path / "d", events=moments["s2"], views=moments["s2"], mailbox=moments["s2"])
    (wal,) = sorted((data_dir / MAILBOX).glob("*.log"))
    before = (moments["s1"] / MAILBOX / wal.name).read_bytes()
    after = wal.read_bytes()
    assert len(before) < len(after) and after.startswith(before)  # S1's log is a prefix of S2's
    with wal.open("r+b") as f:
        f.truncate(len(before))  # the tail a sync never reached
    assert len(mailbox_entries(data_dir)) < len(moments["entries"])

    with caplog.at_level(logging.WARNING, logger="fanout.runtime"):
        assert_whole(data_dir, moments)
    healed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mailbox healed")]
    assert len(healed) == 1 and "293 entries of 11 messages" in healed[0], healed
    assert not list(data_dir.glob("heal-*"))


def test_views_that_lost_their_tail_catch_up_over_the_kept_mailbox(moments: dict[str, Any], tmp_path: Path) -> None:
    """The reverse: the mailbox of S2 on disk, the views only as far as S1. The projector
    applies the log from the views' position and writes the same mailbox keys again."""
    data_dir = put_together(tmp_path / "d", events=moments["s2"], views=moments["s1"], mailbox=moments["s2"])
    assert_whole(data_dir, moments)


def test_views_ahead_of_the_event_store_refuse_to_start(moments: dict[str, Any], tmp_path: Path) -> None:
    """An event store of S1 under views and a mailbox of S2 (an older copy put back): new
    events would reuse the positions the views hold as applied. The start refuses in one
    line, and `fanout rebuild all`, which it names, rebuilds the views to the event store."""
    data_dir = put_together(tmp_path / "d", events=moments["s1"], views=moments["s2"], mailbox=moments["s2"])
    rt = bootstrap(Settings.embedded(data_dir, PARAMS), clock=FakeClock())
    try:
        with pytest.raises(AheadOfTheLog, match=r"past|event store ends at") as refused:
            rt.start()
        assert not rt.running
    finally:
        rt.close()
    message = str(refused.value)
    assert "\n" not in message and "`fanout rebuild all`" in message

    rebuild(Settings.embedded(data_dir, PARAMS), "all", progress=False)

    entries = start_and_settle(data_dir)
    assert Counter(e[1] for e in entries) == Counter(e[1] for e in mailbox_entries(moments["s1"]))
    assert verify(Settings.embedded(data_dir, PARAMS), progress=False).equal


def test_a_mailbox_ahead_of_the_event_store_refuses_to_start(moments: dict[str, Any], tmp_path: Path) -> None:
    """The views and event store of S1 with the mailbox of S2: the mailbox holds entries of
    positions the next events will take. Refused; `fanout rebuild mailbox` repairs it."""
    data_dir = put_together(tmp_path / "d", events=moments["s1"], views=moments["s1"], mailbox=moments["s2"])
    rt = bootstrap(Settings.embedded(data_dir, PARAMS), clock=FakeClock())
    try:
        with pytest.raises(AheadOfTheLog) as refused:
            rt.start()
    finally:
        rt.close()
    assert "`fanout rebuild mailbox`" in str(refused.value)

    rebuild(Settings.embedded(data_dir, PARAMS), "mailbox", progress=False)

    assert start_and_settle(data_dir) == mailbox_entries(moments["s1"])
    assert verify(Settings.embedded(data_dir, PARAMS), progress=False).equal
