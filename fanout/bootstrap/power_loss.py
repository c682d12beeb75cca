"""What a power loss or a kernel crash can leave in an embedded data dir, checked before the
projector starts (docs/adr/0056-embedded-power-loss.md).

The event store fsyncs each commit (SQLite, synchronous=FULL); the views (SQLite,
synchronous=NORMAL) and the mailbox (RocksDB, no fsync) each come back as a prefix of their
commits, but not the same prefix. Views behind the event store or behind the mailbox heal
by themselves (the projector re-applies the log from their tracking position, rewriting the
mailbox's idempotent keys). The two other outcomes are caught here:

* **The mailbox behind the views**: the views hold units whose mailbox entries RocksDB lost,
  and nothing would write them again. The views record with each unit the last message whose
  entries it wrote (`SqliteViews.mailbox_written`), the mailbox the highest message its kept
  writes reach (`MailboxStore.written`). Below: the log up to that message is projected again
  into scratch views beside the live ones (the projections of the mailbox only, as
  `fanout rebuild mailbox` projects them), and the entries of the messages after the mailbox's
  mark are written into the live mailbox (the same keys and values a unit writes).
* **Views or mailbox ahead of the event store**: the event store lost its tail (an older copy
  put back; a power loss cannot do it with synchronous=FULL on a disk that keeps its fsyncs),
  and the next events would reuse the positions the views hold as applied. Refused, with what
  to run (`AheadOfTheLog`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from adapters.sqlite.views import SqliteViews
from domain.params import Parameters
from fanout.application import FanoutApplication
from projections.ports import MailboxEntry, MailboxStore, MessageRefs
from streams.embedded import EmbeddedRunner

log = logging.getLogger("fanout.runtime")

HEAL_PREFIX = "heal-"  # the scratch views of a heal: heal-views.sqlite beside views.sqlite


class AheadOfTheLog(RuntimeError):
    """The views or the mailbox hold positions the event store does not have: refused."""


class _After:
    """The live mailbox as a heal writes it: the messages after `after` only (those at or
    below it are in the mailbox already); closing it leaves the live store open."""

    def __init__(self, inner: MailboxStore, after: int) -> None:
        self.inner, self.after = inner, after
        self.messages = self.entries = 0  # what the heal wrote

    def write(self, tenant: str, refs: MessageRefs) -> int:
        if refs.pos <= self.after:
            return 0
        n = self.inner.write(tenant, refs)
        self.messages, self.entries = self.messages + 1, self.entries + n
        return n

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        return self.inner.read(tenant, user_id, after, until, limit)

    def count(self) -> int:
        return self.inner.count()

    def written(self) -> int | None:
        return self.inner.written()

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        return self.inner.all_entries()

    def sort_key(self, tenant: str, user_id: str, pos: int) -> Any:
        return self.inner.sort_key(tenant, user_id, pos)

    def flush(self) -> None:
        self.inner.flush()

    def reopen(self) -> None:
        self.inner.reopen()

    def close(self) -> None:
        pass  # the live mailbox is the live views'


def check_data_dir(app: FanoutApplication, views: SqliteViews, params: Parameters) -> None:
    """Before the projector starts: refuse views or a mailbox ahead of the event store;
    write again the mailbox entries the views hold and the mailbox lost."""
    end = app.recorder.max_notification_id() or 0
    applied = max(views.positions().values(), default=0)
    if applied > end:
        raise AheadOfTheLog(
            f"the views in {views.dir} stand at position {applied} but the event store ends at {end}: it lost its "
            f"last {applied - end} events (an older copy put back?) and new events would reuse their positions. "
            "Put the newer events.sqlite back if there is one; else run `fanout rebuild all` (the views then "
            "show what the event store holds)"
        )
    written = views.mailbox.written()
    if written is not None and written > end:
        raise AheadOfTheLog(
            f"the mailbox in {views.dir} holds entries up to position {written} but the event store ends at {end}: "
            "it lost its last events (an older copy put back?) and new events would reuse their positions. Put the "
            "newer events.sqlite back if there is one; else run `fanout rebuild mailbox`"
        )
    needed = views.mailbox_written()
    if needed is not None and (written or 0) < needed:
        heal_mailbox(app, views, params, after=written or 0, until=needed)


def heal_mailbox(app: FanoutApplication, views: SqliteViews, params: Parameters, *, after: int, until: int) -> None:
    """Write into the live mailbox the entries of the messages in (after, until]: the log
    1..until projected again into scratch views (mailbox projections only), the writes of
    the messages at or below `after` dropped. A heal cut short is done again at the next
    start (the mailbox's mark is written with the entries)."""
    log.warning(
        "the mailbox holds the writes up to position %d but the views hold units up to the message at %d: a power "
        "loss or a kernel crash took its last writes (RocksDB writes without fsync); writing the entries of the "
        "messages after %d again from the event store",
        after,
        until,
        after,
    )
    started = time.monotonic()
    remove_scratch(views.dir)
    mailbox = _After(views.mailbox, after)
    scratch = SqliteViews(views.dir, mailbox, prefix=HEAL_PREFIX)
    try:
        runner = EmbeddedRunner(app, scratch, params, targets=frozenset({"mailbox"}), until=until)
        runner.catch_up()
    finally:
        scratch.close()
        remove_scratch(views.dir)
    views.mailbox.flush()
    log.warning(
        "mailbox healed: %d entries of %d messages written again in %.1f s (positions %d..%d)",
        mailbox.entries,
        mailbox.messages,
        time.monotonic() - started,
        after + 1,
        until,
    )


def remove_scratch(data_dir: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{data_dir / (HEAL_PREFIX + 'views.sqlite')}{suffix}").unlink(missing_ok=True)
