"""The views the composition root builds on Cassandra (`fanout.bootstrap.open_cassandra_views`)
report the mailbox layer's write time to the timer they are given (fanout.rereview.MailboxMeter,
a projections.ports.MailboxTimer, ADR-0026). The mailbox entries must still ride the first
round of a unit of work (ADR-0025) and the meter must still count them: a change of 2026-12-04
lost 3-4x of the worker's and Cassandra's CPU per small-group message for a day because the
views took a wrapped store for another engine's and wrote its entries one batch per shard list
ahead of the round (the timer is no wrapper since)."""

from __future__ import annotations

from typing import Any

from adapters.cassandra.mailbox import CassandraMailbox
from fanout.bootstrap import open_cassandra_views
from fanout.rereview import FANOUT_WRITE, MailboxMeter
from fanout.urls import cassandra_settings
from projections.ports import MessageRefs


def refs(members: int, pos: int) -> MessageRefs:
    users = [f"u{i:05d}" for i in range(members)]
    return MessageRefs("big", pos, pos, 0, {}, {s: users[s::4] for s in range(4)})


def test_the_mailbox_rides_round_a_and_is_timed(fresh_cassandra: str) -> None:
    meter = MailboxMeter()
    views = open_cassandra_views(cassandra_settings(fresh_cassandra), partitions=1, timer=meter)
    try:
        mailbox: Any = views.mailbox
        assert isinstance(mailbox, CassandraMailbox)
        written: list[int] = []
        slow_write = mailbox.write
        mailbox.write = lambda tenant, r: written.append(1) or slow_write(tenant, r)
        with views.unit_of_work() as w:
            w.put_mailbox("acme", refs(FANOUT_WRITE + 200, 1))
            w.put_mailbox("acme", refs(20, 2))
            w.track("delivery", 2)
        assert written == [], "the entries went through the store's own write, not round A"
        assert meter.entries == FANOUT_WRITE + 200 + 20 and meter.seconds > 0
        assert mailbox.count() == FANOUT_WRITE + 200 + 20
        assert len(mailbox.read("acme", "u00000", 0, 10, 10)) == 2
    finally:
        views.close()


def test_the_views_and_the_mailbox_share_one_cluster_which_the_views_shut_down_once(fresh_cassandra: str) -> None:
    """One Cluster per process (adapters/cassandra/connect.py): the mailbox borrows the views'
    session, its close() leaves the Cluster up; the views own it, and closing them twice is harmless."""
    views = open_cassandra_views(cassandra_settings(fresh_cassandra), partitions=1)
    cluster = views.session.cluster
    try:
        mailbox: Any = views.mailbox
        assert mailbox.session is views.session
        mailbox.close()
        assert not cluster.is_shutdown and views.position("delivery") == 0
    finally:
        views.close()
    assert cluster.is_shutdown
    views.close()
