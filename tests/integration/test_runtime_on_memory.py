"""The composition root with every adapter swapped: the same runtime (commands, runner,
projections, queries, push) over eventsourcing's in-memory event store and the in-memory
views and mailbox. If a module still reached past the ports into SQLite, this would fail."""

from __future__ import annotations

from pathlib import Path

from adapters.memory import MemoryViews
from domain.params import Parameters
from fanout.bootstrap import bootstrap
from fanout.clock import FakeClock
from fanout.config import Settings


def test_the_readme_story_runs_on_the_in_memory_adapters(tmp_path: Path) -> None:
    clock = FakeClock()
    views = MemoryViews()
    rt = bootstrap(
        Settings.embedded(tmp_path, Parameters(mailbox_shards=4)),
        clock=clock,
        views=views,
        event_store_env={"PERSISTENCE_MODULE": "eventsourcing.popo"},
    )
    try:
        rt.app.create_conversation("acme", "general", "General", ["alice", "bob", "carol"])
        sent = rt.app.send_message("acme", "general", sender="alice", text="hi @bob", mentions=["bob"])
        clock.advance(3.0)
        rt.app.add_members("acme", "general", ["dave"])
        rt.app.send_message("acme", "general", sender="bob", text="@all", mention_all=True)
        rt.catch_up()
        sessions, _ = rt.queries.session_list("acme", "bob")
        assert sessions[0]["unread_count"] == 0 and sessions[0]["mention_count"] == 0  # bob sent the latest
        (carol,) = rt.queries.session_list("acme", "carol")[0]
        assert carol["unread_count"] == 2 and carol["mention_count"] == 1 and carol["unread_exact"] is True
        assert rt.queries.delivery("acme", "general", sent["conversation_seq"])["mailbox_entries"] == 3
        assert [e["conversation_seq"] for e in rt.queries.mailbox("acme", "dave", 0, 10)["entries"]] == [2]
        assert views.mailbox.count() == 3 + 4
        assert not any(tmp_path.glob("*.sqlite")) and not any(tmp_path.glob("*.rocksdb"))
    finally:
        rt.close()
