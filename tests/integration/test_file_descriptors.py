"""File descriptors (ADR-0010): logins in progress borrow pooled read connections (the
heads of the session list are read a batch at a time from one cursor), so many of them
at once cannot run the process out of descriptors (a SQLite connection in WAL mode holds
three: the database, -wal and -shm)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import psutil

from adapters.sqlite.connect import READ_POOL_SIZE
from fanout.bootstrap import bootstrap
from fanout.config import Settings

LOGINS = 60


def test_concurrent_logins_do_not_grow_open_descriptors_beyond_the_pool() -> None:
    proc = psutil.Process()
    with bootstrap(Settings.embedded(tempfile.mkdtemp())) as rt:
        for i in range(5):
            rt.app.create_conversation("acme", f"g{i}", "G", ["ann", "bob"])
        rt.runner.catch_up()

        def start_login() -> Iterator[dict[str, Any]]:
            return rt.queries.session_batches("acme", "ann", 2)

        expected = list(start_login())
        assert sum(len(f["sessions"]) for f in expected) == 5
        before = proc.num_fds()
        logins = [start_login() for _ in range(LOGINS)]
        firsts = [next(login) for login in logins]  # every login holds its list open mid-way
        grown = proc.num_fds() - before
        assert grown <= 3 * READ_POOL_SIZE + 3, f"{LOGINS} logins in progress opened {grown} descriptors"
        for first, login in zip(firsts, logins, strict=True):
            assert [first, *login] == expected  # pooled or not, the same list
        for login in logins[:5]:
            login.close()
        # finished logins give their connection back: a second wave opens nothing new
        again = [start_login() for _ in range(LOGINS)]
        for login in again:
            next(login)
        assert proc.num_fds() - before <= grown
        for login in again:
            login.close()
