"""A store's failure surfaces as a port error (projections/errors.py), never as its driver's:
each engine provoked for real where that is cheap. SQLite views and mailbox: a database held
to its page count (SQLITE_FULL) and a views file that is no database; the embedded event store
and the RocksDB mailbox: a full disk (RLIMIT_FSIZE, in a child process: the limit is the
process's); Cassandra: requests that time out. PostgreSQL's disk cannot be filled here: its
translation is checked on the driver's DiskFull. The in-memory stores have no storage to fail."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.errors import DiskFull, UniqueViolation

from adapters.postgres.connect import storage_error as postgres_storage_error
from adapters.sqlite.mailbox import SqliteMailbox
from fanout.bootstrap import open_views
from fanout.bootstrap.replica import open_cassandra_views
from fanout.overload import storage_unavailable
from fanout.urls import cassandra_settings
from projections.errors import StorageError, StorageFull, StorageIOError, StorageUnavailable
from tests.contract.test_mailbox_store import refs
from tests.contract.test_view_store import message

REPO = Path(__file__).resolve().parents[2]
T = "acme"


def fill(con: Any) -> None:
    """Hold the SQLite connection `con` writes through to the pages its database has now."""
    pages = con.execute("PRAGMA page_count").fetchone()[0]
    con.execute(f"PRAGMA max_page_count={pages}")


def test_sqlite_views_a_full_database_fails_the_unit_with_storage_full_and_the_next_one_commits(
    tmp_path: Path,
) -> None:
    views = open_views(tmp_path, 4)
    try:
        fill(views._con)
        with pytest.raises(StorageFull) as raised, views.unit_of_work() as w:
            for seq in range(1, 400):
                w.put_message(T, "c", message("c", seq, seq))  # type: ignore[arg-type]
            w.track("delivery", 399)
        assert "full" in str(raised.value)
        assert storage_unavailable(raised.value) is not None
        views._con.execute("PRAGMA max_page_count=1073741823")  # space again
        with views.unit_of_work() as w:
            w.put_message(T, "c", message("c", 1, 1))  # type: ignore[arg-type]
            w.track("delivery", 1)
        assert views.position("delivery") == 1
    finally:
        views.close()


def test_sqlite_views_on_a_file_that_is_no_database_fail_to_open_with_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "views.sqlite").write_bytes(b"not a database, " * 512)
    with pytest.raises(StorageError) as raised:
        open_views(tmp_path, 4)
    assert raised.value.reason is None  # nothing to wait out: `fanout` says it cannot use the file
    assert "not a database" in str(raised.value)


def test_sqlite_mailbox_a_full_database_fails_the_write_with_storage_full(tmp_path: Path) -> None:
    mailbox = SqliteMailbox(tmp_path / "mailbox.sqlite")
    try:
        fill(mailbox._write)
        with pytest.raises(StorageFull):
            mailbox.write(T, refs("c", 1, 1, [f"u{i}" for i in range(5000)]))
    finally:
        mailbox.close()


def on_a_full_disk(script: str, tmp_path: Path) -> list[str]:
    """Run `script` in a child process whose files cannot grow past 200 kB (a full disk, as
    tests/integration/test_full_disk.py makes one); its last line names the port errors of the
    exception `failed` it assigned, innermost last."""
    code = textwrap.dedent(
        """
        import resource, sys
        from pathlib import Path
        from projections.errors import StorageError
        from projections.failures import exception_chain
        data = Path(sys.argv[1])
        def full():
            resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        failed = None
        """
    ) + textwrap.dedent(script) + textwrap.dedent(
        """
        print(",".join(type(e).__name__ for e in exception_chain(failed) if isinstance(e, StorageError)))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1].split(",")


def test_rocksdb_mailbox_on_a_full_disk_fails_the_write_with_storage_full(tmp_path: Path) -> None:
    names = on_a_full_disk(
        """
        from adapters.rocksdb.mailbox import RocksMailbox
        from projections.ports import MessageRefs
        mailbox = RocksMailbox(data / "mailbox.rocksdb", 4)
        full()
        try:
            for pos in range(1, 10_000):
                mailbox.write("t", MessageRefs("c", pos, pos, 0, {}, {0: [f"u{i}" for i in range(100)]}))
        except Exception as exc:
            failed = exc
        """,
        tmp_path,
    )
    assert names == ["StorageFull"]


def test_sqlite_event_store_on_a_full_disk_fails_the_command_with_a_storage_error(tmp_path: Path) -> None:
    names = on_a_full_disk(
        """
        from domain.params import Parameters
        from fanout.bootstrap import open_application
        app = open_application(Parameters(), data)
        full()
        try:
            for i in range(10_000):
                app.create_conversation("t", f"c{i}", "x" * 200, [f"u{j}" for j in range(20)])
        except Exception as exc:
            failed = exc
        """,
        tmp_path,
    )
    # SQLite says SQLITE_FULL when the disk has no space, an I/O error when a file may not grow
    assert names in (["StorageFull"], ["StorageIOError"])


def test_postgres_a_full_disk_is_storage_full() -> None:
    assert isinstance(postgres_storage_error(DiskFull("could not extend file: No space left on device")), StorageFull)
    assert postgres_storage_error(UniqueViolation("duplicate key")) is None  # a lost race, the command's to handle


class TestCassandra:
    @pytest.fixture
    def views(self, fresh_cassandra: str) -> Iterator[Any]:
        views = open_cassandra_views(cassandra_settings(fresh_cassandra), partitions=1)
        yield views
        views.close()

    @staticmethod
    def time_out(views: Any, seconds: float) -> None:
        for profile in views._connection.cluster.profile_manager.profiles.values():
            profile.request_timeout = seconds

    def test_requests_that_time_out_are_storage_unavailable(self, views: Any) -> None:
        self.time_out(views, 1e-6)
        try:
            with pytest.raises(StorageUnavailable):
                views.head(T, "c")
            with pytest.raises(StorageUnavailable):
                views.log_position_later(0)()
            with pytest.raises(StorageUnavailable):
                views.mailbox.read(T, "u", 0, 10, 10)
            with pytest.raises(StorageUnavailable) as raised, views.unit_of_work() as w:
                w.put_message(T, "c", message("c", 1, 1))
                w.track("delivery", 1)
            assert storage_unavailable(raised.value) is not None
            assert isinstance(raised.value, StorageError) and not isinstance(raised.value, StorageIOError)
        finally:
            self.time_out(views, 30.0)
        assert views.head(T, "c") is None  # answering again
