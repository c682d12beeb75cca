"""The operator tools on the distributed engines (ADR-0016): `fanout replay` reads the
PostgreSQL log, `fanout verify` compares the Cassandra views with the log projected into
a scratch keyspace, `fanout rebuild` builds aside and merges into the live tables,
`fanout analyze` reads the Cassandra views, `fanout demo --distributed` runs the story on
the real engines. Each through `cli.main.main`, with the engine URLs in the environment."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.cassandra.mailbox import partition_shard
from adapters.cassandra.session_states import vouched
from adapters.cassandra.stamps import stamp
from cli.main import main
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.bootstrap import bootstrap, postgres_event_store
from fanout.clock import FakeClock
from fanout.config import Settings
from fanout.urls import cassandra_settings
from tests.distributed.cluster import Cluster, running_cluster

T = "acme"
URL_KEYS = ("FANOUT_EVENT_STORE", "FANOUT_LOG", "FANOUT_VIEWS")


def use_engines(monkeypatch: pytest.MonkeyPatch, urls: dict[str, str] | None) -> None:
    """The settings of the next `main` call: these URLs (None: the embedded runtime)."""
    import os

    for k in list(os.environ):
        if k.startswith("FANOUT_") and not k.startswith("FANOUT_ENGINES"):
            monkeypatch.delenv(k)
    for k, v in (urls or {}).items():
        monkeypatch.setenv(k, v)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- replay ---------------------------------------------------------------------------------


def commands(app: FanoutApplication, clock: FakeClock) -> None:
    app.create_conversation(T, "g", "general", ["a", "b", "c"])
    app.create_conversation(T, "h", "other", ["a", "d"])
    for i in range(5):
        clock.advance(4.0)
        app.send_message(T, "g", sender="a", text=f"hello {i} @b", mentions=["b"])
    clock.advance(4.0)
    app.send_message(T, "h", sender="d", text="hi", reply_to_seq=None)
    app.add_members(T, "g", ["e", "f"])
    app.mark_read(T, "g", "b", 3)
    app.remove_member(T, "g", "c")
    clock.advance(4.0)
    app.send_message(T, "g", sender="b", text="answer", reply_to_seq=2)


def normalized(text: str) -> list[dict[str, Any]]:
    """Replay lines without what differs between two runs of the same commands: the
    recording time and the random message ids."""
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        line.pop("timestamp")
        if "message_id" in line:
            line["message_id"] = "m_"
    return lines


def test_replay_of_the_postgresql_log_equals_the_embedded_one(
    fresh_postgres: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    start = float(int(time.time()))
    clock = FakeClock(start)
    with bootstrap(Settings.embedded(tmp_path / "data"), clock=clock) as rt:
        commands(rt.app, clock)
    clock = FakeClock(start)

    def sender(tenant: str, cid: str, seq: int) -> str | None:  # as the runtimes wire it
        sent = app.history.sent_message(tenant, cid, seq)
        return sent.sender if sent is not None else None

    app = FanoutApplication(Parameters(), postgres_event_store(fresh_postgres), clock=clock, message_sender=sender)
    try:
        commands(app, clock)
    finally:
        app.close()
    urls = {
        "FANOUT_EVENT_STORE": fresh_postgres,
        "FANOUT_LOG": "kafka://127.0.0.1:1",
        "FANOUT_VIEWS": "cassandra://127.0.0.1:1/unused",
    }
    for args in ([], ["--type", "MessageSent", "--tenant", T, "--conversation", "g"], ["--from-position", "5"]):
        use_engines(monkeypatch, None)
        code, embedded, _ = run(capsys, "replay", "-q", "--data-dir", str(tmp_path / "data"), *args)
        assert code == 0
        use_engines(monkeypatch, urls)
        code, distributed, err = run(capsys, "replay", "-q", *args)
        assert code == 0, err
        assert normalized(distributed) == normalized(embedded), args
        assert len(distributed.splitlines()) > 3
    code, _, err = run(capsys, "replay", "-q", "--tenant", "nope")
    assert code == 2 and "no tenant 'nope' in the log" in err


# -- verify, rebuild, analyze on a deployment -------------------------------------------------


@pytest.fixture
def cluster(fresh_postgres: str, fresh_kafka: str, fresh_cassandra: str, tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(fresh_postgres, fresh_kafka, fresh_cassandra, tmp_path / "logs") as c:
        yield c


def traffic(rt: Any, n: int = 300) -> None:
    members = [f"u{i:04d}" for i in range(n)]
    rt.app.create_conversation(T, "big", "big", members)
    rt.app.create_conversation(T, "small", "small", members[:4])
    for i in range(6):
        rt.app.send_message(T, "big", sender=members[i], text=f"m{i}", mentions=[members[i + 10]])
        rt.app.send_message(T, "small", sender=members[i % 4], text=f"s{i}", reply_to_seq=i or None)
    rt.app.mark_read(T, "big", members[20], 4)
    rt.app.add_members(T, "small", members[4:8])
    rt.app.remove_member(T, "big", members[299])
    rt.app.send_message(T, "big", sender=members[0], text="after", announcement=True)


def cql(url: str, *statements: str) -> None:
    from cassandra.cluster import Cluster as CassandraCluster

    c = cassandra_settings(url)
    cluster = CassandraCluster(list(c.hosts), port=c.port, protocol_version=5)
    try:
        session = cluster.connect(c.keyspace)
        for stmt in statements:
            session.execute(stmt)
    finally:
        cluster.shutdown()


def test_verify_finds_a_corrupted_row_and_rebuild_restores_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rt = cluster.runtimes[0]
    traffic(rt)
    cluster.settle(rt, timeout=120)
    use_engines(monkeypatch, {**cluster.urls, **cluster.settings_env})

    # consistent, beside a running (idle) worker
    code, out, err = run(capsys, "verify")
    assert code == 0, out + err
    assert "views equal the log" in out and "mailbox" in out
    assert "recompute" in err  # progress on stderr

    code, out, err = run(capsys, "analyze", "alpha", "--tenant", T)
    assert code == 0, err
    assert "medium" in out or "small" in out
    code, out, err = run(capsys, "analyze", "capacity", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["messages_total"] == 13 and report["entries_total"] > 1800  # merged over the 4 partitions

    # one corrupted row in each of three tables
    # Written as a faulty unit at the views' position would write them (stamped between the
    # units' rank and the rebuild's, adapters/cassandra/stamps.py): a write at the driver's
    # wall-clock stamp would lose to the rows there and change nothing.
    last = rt.queries.mailbox(T, "u0100", 0, 100)["entries"][-1]["cursor"]
    ts = stamp(max(rt.views.positions().values()), 1)
    shard = partition_shard(b"u0100")  # the entry's partition (ADR-0038): its hour from the row itself
    mailbox: Any = rt.views.mailbox
    hour = mailbox.session.execute(
        f"SELECT hour FROM {mailbox.keyspace}.mailbox WHERE tenant='{T}' AND shard={shard} AND user_id='u0100' "
        f"AND pos={last} "
        "ALLOW FILTERING"
    ).one()["hour"]
    cql(
        cluster.urls["FANOUT_VIEWS"],
        f"UPDATE user_states USING TIMESTAMP {ts} SET read_conversation_seq=99 "
        f"WHERE tenant='{T}' AND user_id='u0020' AND conversation_id='big'",
        f"DELETE FROM mailbox USING TIMESTAMP {ts} WHERE tenant='{T}' AND shard={shard} AND hour={hour} "
        f"AND user_id='u0100' AND pos={last}",
        f"INSERT INTO heads_by_tenant (tenant, conversation_id, size_bucket) VALUES ('{T}', 'ghost', 'small') "
        f"USING TIMESTAMP {ts}",
        # the login's states copy as a keyspace written before it has it (ADR-0043): a row
        # missing, nothing vouched
        f"DELETE FROM session_states USING TIMESTAMP {ts} WHERE tenant='{T}' AND user_id='u0020' "
        "AND conversation_id='big'",
        "TRUNCATE copies_complete",
    )
    assert not vouched(rt.views.session, rt.views.keyspace)
    code, out, err = run(capsys, "verify", "-q")
    assert code == 1, out + err
    assert "user_states" in out and "DIFFERS: 1 live-only, 1 recomputed-only" in out
    assert "mailbox" in out and "DIFFERS: 0 live-only, 1 recomputed-only" in out
    assert "('acme', 'ghost', 'small')" in out
    assert "99" in out  # the corrupted value is shown

    # rebuild refuses while a worker runs
    code, _, err = run(capsys, "rebuild", "all", "-q")
    assert code == 2 and "stop every worker" in err

    cluster.kill("worker", signal.SIGTERM)
    deadline = time.monotonic() + 60
    while rt.links.workers() > 0:
        assert time.monotonic() < deadline, "the stopped worker stayed in the consumer group"
        time.sleep(0.5)
    code, out, err = run(capsys, "rebuild", "all", "-q")
    assert code == 0, out + err
    assert "merged into the live tables" in out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "(1 written, 0 deleted)" in lines["user_states"]
    assert "(1 written, 0 deleted)" in lines["mailbox"]
    assert "(0 written, 1 deleted)" in lines["heads_by_tenant"]
    assert "(0 written, 0 deleted)" in lines["delivery"]
    assert "(1 written, 0 deleted)" in lines["session_states"]
    assert vouched(rt.views.session, rt.views.keyspace)  # both merged: the copy is whole again
    code, out, err = run(capsys, "verify", "-q")
    assert code == 0, out + err

    # the rebuilt tables are the live ones: a worker started again continues on them
    cluster.start("worker")
    cluster.wait_workers(1)
    sent = rt.app.send_message(T, "big", sender="u0001", text="after the rebuild")
    assert rt.wait_until(sent["position"], timeout=120), cluster.log_of("worker")
    assert rt.queries.session_list(T, "u0020")[0][0]["read_conversation_seq"] == 4
    code, out, err = run(capsys, "verify", "-q")
    assert code == 0, out + err


# -- demo ------------------------------------------------------------------------------------


def test_demo_distributed_runs_end_to_end(
    engines: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_engines(monkeypatch, engines)
    code, out, err = run(capsys, "demo", "--distributed", "--members", "2000")
    assert code == 0, out[-3000:] + err[-3000:]
    assert "[10/10]" in out and "converged: True" in out
    assert "mention_only" in out and "WritePolicyChanged always -> mention_only" in out
    assert "relay and worker up" in err
    assert "could not drop" not in err


# -- a keyspace of the mailbox layout before ADR-0038 -----------------------------------------


OLD_MAILBOX_LAYOUTS = {
    "ADR-0038": (  # before it: a partition per member
        "CREATE TABLE {ks}.mailbox (tenant text, user_id text, pos bigint, conversation_seq bigint, "
        "conversation_id text, flags int, PRIMARY KEY ((tenant, user_id), pos))",
        "INSERT INTO {ks}.mailbox (tenant, user_id, pos, conversation_seq, conversation_id, flags) "
        "VALUES ('acme', 'a', 1, 1, 'g', 0)",
    ),
    "ADR-0040": (  # before it: an entry in three cells
        "CREATE TABLE {ks}.mailbox (tenant text, shard int, hour bigint, user_id text, pos bigint, "
        "conversation_seq bigint, conversation_id text, flags int, PRIMARY KEY ((tenant, shard, hour), user_id, pos))",
        "INSERT INTO {ks}.mailbox (tenant, shard, hour, user_id, pos, conversation_seq, conversation_id, flags) "
        "VALUES ('acme', 7, 480000, 'a', 1, 1, 'g', 0)",
    ),
    "ADR-0050": (  # before it: a partition per tenant hour
        "CREATE TABLE {ks}.mailbox (tenant text, shard int, hour bigint, user_id text, pos bigint, ref blob, "
        "PRIMARY KEY ((tenant, shard, hour), user_id, pos))",
        "INSERT INTO {ks}.mailbox (tenant, shard, hour, user_id, pos, ref) VALUES ('acme', 7, 480000, 'a', 1, 0x00)",
    ),
}


@pytest.mark.parametrize("adr", sorted(OLD_MAILBOX_LAYOUTS))
def test_a_keyspace_with_the_old_mailbox_layout_is_refused_with_what_to_do(
    fresh_postgres: str,
    fresh_kafka: str,
    new_cassandra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    adr: str,
) -> None:
    """A keyspace made before ADR-0038 keys its `mailbox` table by member, one made before
    ADR-0040 keeps an entry in three cells: opened as it is, the views would read its entries
    as absent (or every write would fail). The tools refuse it in one line naming the keyspace,
    the ADR and what to do, and change nothing in it."""
    from cassandra.cluster import Cluster as DriverCluster

    c = cassandra_settings(new_cassandra)
    driver = DriverCluster(list(c.hosts), port=c.port, protocol_version=5)
    try:
        session = driver.connect()
        session.execute(
            f"CREATE KEYSPACE {c.keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        )
        for statement in OLD_MAILBOX_LAYOUTS[adr]:
            session.execute(statement.format(ks=c.keyspace))
        use_engines(
            monkeypatch,
            {"FANOUT_EVENT_STORE": fresh_postgres, "FANOUT_LOG": fresh_kafka, "FANOUT_VIEWS": new_cassandra},
        )
        code, out, err = run(capsys, "verify")
        assert code == 2, out + err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert c.keyspace in err and adr in err and "new keyspace" in err
        tables = {
            r[0]
            for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name=%s", (c.keyspace,)
            )
        }
        assert tables == {"mailbox"}  # nothing created beside it
        assert session.execute(f"SELECT count(*) FROM {c.keyspace}.mailbox").one()[0] == 1
    finally:
        driver.shutdown()
