"""What only the distributed runtime has: several API replicas over one deployment (one
event store, one Kafka topic, the workers, one keyspace). Replica A is the module's server,
replica B a second DistributedRuntime of the same cluster behind its own aiohttp server.

* invariant O across processes: a socket on B gets the push of a message sent through A,
  and by then B reads it from the views;
* read-your-writes across replicas: the position A answers, given to B, makes B's read wait;
* bad input is answered the same by the embedded runtime and both replicas, nothing written;
* /readyz reports the engines and the workers, 503 while no worker runs;
* /v1/admin/projections shows each projection's position per log partition."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import Api, Server, conversation, eventually, expect, replica_server, serving
from tests.e2e.test_bad_input import BAD_REQUESTS

RUNTIMES = ("distributed",)  # replicas exist in the distributed runtime only


@pytest.fixture(scope="module")
def second(server: Server) -> Iterator[Server]:
    """Replica B: another API process's view of the same deployment."""
    assert server.cluster is not None
    with replica_server(server.cluster) as s:
        yield s


@pytest.fixture(autouse=True)
def a_worker(server: Server) -> None:
    """A worker runs when a test starts (the readyz test kills one)."""
    assert server.cluster is not None
    if "worker" not in server.cluster.procs:
        server.cluster.start("worker")
        server.cluster.wait_workers(1)


@pytest.fixture
async def apis(server: Server, second: Server) -> AsyncIterator[tuple[Api, Api]]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, server), Api(session, second)


async def test_a_message_sent_through_one_replica_is_pushed_by_the_other_once_its_views_hold_it(
    apis: tuple[Api, Api], cid: str
) -> None:
    a, b = apis
    svc = await conversation(a, "acme", cid, ["ann", "bob", "cat"])
    created = svc.seen.position
    bob_b = b.user("acme", "bob")
    # the socket's session list is read from B's views: wait until they hold the conversation
    expect(await bob_b.call("GET", "/v1/me/sessions", params={"min_position": created}), 200)
    sock = await bob_b.socket()
    await sock.expect("AUTH_OK")
    (batch,) = await sock.session_list()
    assert [s["conversation_id"] for s in batch["sessions"]] == [cid]

    sent = expect(await svc.send(cid, sender="ann", text="across replicas @bob", mentions=["bob"]), 201)
    message = await sock.expect("MESSAGE", timeout=30)
    assert message["conversation_id"] == cid and message["conversation_seq"] == sent["conversation_seq"]
    assert message["message_id"] == sent["message_id"] and message["materialized"] is True
    # Invariant O: the worker hands the push over only after its unit of work committed, so
    # B's views already hold the message when its socket gets it (reads without min_position).
    svc_b = b.service("acme")
    record = expect(await svc_b.delivery(cid, sent["conversation_seq"]), 200)
    assert record["state"] == "materialized" and record["materialized_at"] is not None
    assert record["mailbox_entries"] == 3
    assert expect(await svc_b.head(cid), 200)["latest_conversation_seq"] == sent["conversation_seq"]
    history = expect(await bob_b.history(cid), 200)
    assert [m["message_id"] for m in history["messages"]] == [sent["message_id"]]
    [item] = [s for s in expect(await bob_b.sessions(), 200)["sessions"] if s["conversation_id"] == cid]
    assert item["unread_count"] == 1 and item["mention_count"] == 1
    # The mailbox cursor serves entries up to the views' position (the lowest over every partition) (other
    # partitions may still be applying the relay's watermark): at the send's position it has it.
    box = await bob_b.call("GET", "/v1/me/mailbox", params={"after": 0, "min_position": sent["position"]})
    assert [(e["conversation_id"], e["conversation_seq"]) for e in expect(box, 200)["entries"]] == [
        (cid, sent["conversation_seq"])
    ]
    # the push is counted in the delivery record by the replica that pushed it
    await eventually(lambda: svc_b.delivery(cid, sent["conversation_seq"]), lambda r: r.body["online_pushes"] >= 1)
    await sock.close()


async def test_a_write_through_one_replica_is_read_through_the_other_at_its_position(
    apis: tuple[Api, Api], cid: str
) -> None:
    a, b = apis
    svc_a, svc_b = a.service("acme"), b.service("acme")
    created = await svc_a.create_conversation(conversation_id=cid, members=["ann", "bob"])
    expect(created, 201)
    head = await svc_b.call("GET", f"/v1/conversations/{cid}", params={"min_position": created.body["position"]})
    assert expect(head, 200)["member_count"] == 2

    added = expect(await svc_a.add_members(cid, [f"u{i}" for i in range(5)]), 200)
    sent = expect(await svc_a.send(cid, sender="ann", text="one"), 201)
    assert sent["position"] > added["position"]
    head = await svc_b.call("GET", f"/v1/conversations/{cid}", headers={"X-Fanout-Min-Position": str(sent["position"])})
    assert expect(head, 200)["member_count"] == 7 and head.body["latest_conversation_seq"] == 1

    # and the other way: a MARK_READ through B, the session list read through A at its position
    marked = expect(await b.user("acme", "bob").read(cid, 1), 200)
    assert marked["coalesced"] is False
    sessions = await a.user("acme", "bob").call("GET", "/v1/me/sessions", params={"min_position": marked["position"]})
    [item] = [s for s in expect(sessions, 200)["sessions"] if s["conversation_id"] == cid]
    assert item["read_conversation_seq"] == 1 and item["unread_count"] == 0
    # a position beyond the shared log is refused the same by both replicas
    for api in (a, b):
        beyond = {"min_position": marked["position"] + 1000}
        expect(
            await api.service("acme").call("GET", f"/v1/conversations/{cid}", params=beyond), 400, "INVALID_ARGUMENT"
        )


async def test_bad_input_is_answered_identically_by_both_runtimes_and_both_replicas(
    apis: tuple[Api, Api], tmp_path_factory: pytest.TempPathFactory, cid: str
) -> None:
    a, b = apis
    answers: dict[str, list[tuple[str, int, str | None]]] = {}
    with serving(tmp_path_factory.mktemp("embedded")) as embedded:
        targets = {"embedded": Api(a.session, embedded), "replica A": a, "replica B": b}
        for name, api in targets.items():
            conv = f"{cid}-{name[-1]}"
            svc = await conversation(api, "acme", conv, ["ann", "bob"])
            expect(await svc.send(conv, sender="ann", text="first"), 201)
            await svc.materialized(conv, 1)
            before = api.server.written()
            answers[name] = [(case.id, *_answer_of(await case.answer(api, conv))) for case in BAD_REQUESTS]
            assert api.server.written() == before, f"{name} wrote something"
            head = await svc.call("GET", f"/v1/conversations/{conv}", params={"min_position": before})
            assert expect(head, 200)["latest_conversation_seq"] == 1 and head.body["member_count"] == 2
    expected = [(case.id, case.status, case.error) for case in BAD_REQUESTS]
    assert answers["embedded"] == expected
    assert answers["replica A"] == expected
    assert answers["replica B"] == expected


def _answer_of(reply: Any) -> tuple[int, str | None]:
    return reply.status, reply.error


async def test_the_projections_view_shows_each_projection_per_partition(
    apis: tuple[Api, Api], server: Server, cid: str
) -> None:
    a, b = apis
    svc = await conversation(a, "acme", cid, ["ann"])
    sent = expect(await svc.send(cid, sender="ann", text="x"), 201)
    await svc.materialized(cid, 1)  # a fresh read waits for the conversation's own partition only
    assert server.partitions == [0, 1, 2, 3]
    for api in (a, b):
        # the relay ends each transaction with a watermark on every partition; the other partitions'
        # workers commit it on their own schedule
        reply = await eventually(
            api.admin("acme").projections,
            lambda r: r.status == 200
            and all(p["position"] >= sent["position"] for p in r.body["projections"] if p["name"] == "delivery"),
        )
        body = expect(reply, 200)  # the tracking rows, read from Cassandra
        assert body["running"] is True and body["log_position"] >= sent["position"]
        rows = {(p["name"], p["partition"]): p for p in body["projections"]}
        assert sorted(rows) == [(name, p) for name in ("admin", "capacity", "delivery") for p in range(4)]
        for p in body["projections"]:
            assert p["lag"] == max(0, p["log_position"] - p["position"]) and p["last_error"] is None
        assert all(rows[("delivery", p)]["position"] >= sent["position"] for p in range(4)), rows


async def test_readyz_reports_the_engines_and_the_workers_and_is_503_while_no_worker_runs(
    apis: tuple[Api, Api], server: Server
) -> None:
    cluster = server.cluster
    assert cluster is not None
    for api in apis:
        ready = expect(await api.anonymous().call("GET", "/readyz"), 200)
        assert ready["status"] == "ready" and ready["running"] is True and ready["last_error"] is None
        assert ready["workers"] >= 1 and "errors" not in ready
        for engine in ("event_store", "relay_position", "views_position", "log_position"):
            assert isinstance(ready[engine], int), (engine, ready)
    cluster.kill("worker")  # SIGKILL: it leaves the group when its session times out (6 s)
    for api in apis:
        anon = api.anonymous()
        down = await eventually(partial(anon.call, "GET", "/readyz"), lambda r: r.status == 503, 30)
        assert down.body["status"] == "not_ready" and down.body["workers"] == 0, down.body
        assert down.body["running"] is True and "errors" not in down.body  # the engines answer: no worker is the cause
    cluster.start("worker")  # the next test of the module would start one anyway (a_worker)
    await _in_thread(cluster.wait_workers, 1)
    for api in apis:
        anon = api.anonymous()
        await eventually(partial(anon.call, "GET", "/readyz"), lambda r: r.status == 200, 30)


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
