"""The composition root: adapters given to `bootstrap` are the ones used, settings that name
engines this build lacks are refused, and a failed build leaves the data dir unlocked."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.rocksdb.mailbox import ShardCountMismatch
from adapters.sqlite.mailbox import SqliteMailbox
from domain.params import Parameters
from fanout.bootstrap import DataDirBusy, bootstrap
from fanout.config import ConfigError, Settings
from fanout.runtime import Runtime

PARAMS = Parameters()


def test_a_mailbox_given_to_bootstrap_receives_the_mailbox_entries(tmp_path: Path) -> None:
    mailbox = SqliteMailbox(tmp_path / "given-mailbox.sqlite")
    with bootstrap(Settings.embedded(tmp_path / "data", PARAMS), mailbox=mailbox) as rt:
        rt.app.create_conversation("acme", "general", "General", ["alice", "bob", "carol"])
        rt.app.send_message("acme", "general", sender="alice", text="hi")
        rt.catch_up()
        assert rt.views.mailbox is mailbox and mailbox.count() == 3
    assert not (tmp_path / "data" / "mailbox.rocksdb").exists()


def test_the_embedded_runtime_answers_what_the_entry_points_ask(tmp_path: Path) -> None:
    with bootstrap(Settings.embedded(tmp_path, PARAMS)) as built:
        rt: Runtime = built
        rt.app.create_conversation("acme", "general", "General", ["alice"])
        assert rt.log_position() > rt.position() == 0 and not rt.running
        rt.catch_up()
        assert rt.position() == rt.log_position() and rt.wait_until(rt.log_position(), 0)
        assert set(rt.projections_status().values()) == {rt.position()}
        assert rt.last_error is None and rt.failure_reason is None


def test_settings_naming_other_engines_are_refused_by_the_embedded_bootstrap(tmp_path: Path) -> None:
    settings = Settings(PARAMS, tmp_path, "sqlite", "kafka", "sqlite", None)
    with pytest.raises(ConfigError, match="bootstrap builds the embedded runtime"):
        bootstrap(settings)
    assert not tmp_path.joinpath("fanout.lock").exists()


def test_a_failed_build_releases_the_data_dir(tmp_path: Path) -> None:
    bootstrap(Settings.embedded(tmp_path, PARAMS)).close()  # the mailbox now has PARAMS.mailbox_shards shards
    with pytest.raises(ShardCountMismatch):
        bootstrap(Settings.embedded(tmp_path, Parameters(mailbox_shards=PARAMS.mailbox_shards * 2)))
    with bootstrap(Settings.embedded(tmp_path, PARAMS)), pytest.raises(DataDirBusy):
        bootstrap(Settings.embedded(tmp_path, PARAMS))
