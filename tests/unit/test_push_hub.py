"""fanout/push.py PushHub: who gets a message's frames (invariant O on one process), checked
against a reference that tests every open socket, whichever side `deliver` walks (the
message's members or the tenant's online users)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fanout.push import Connection, PushHub
from projections.delivery import Delivered
from projections.sharding import shard_of

USERS = [f"u{i}" for i in range(12)]
TENANTS = ["acme", "beta"]
HEAD = {"latest_conversation_seq": 9, "last_activity_id": "m9", "preview": "hi", "title": "t"}


class Socket(Connection):
    """A Connection that keeps what it was sent (no event loop)."""

    def __init__(self, tenant: str, user_id: str) -> None:
        self.tenant = tenant
        self.user_id = user_id
        self.frames: list[dict[str, Any]] = []

    def send(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)


class Views:
    def __init__(self, head: dict[str, Any] | None) -> None:
        self._head, self.reads = head, 0

    def head(self, tenant: str, conversation_id: str) -> dict[str, Any] | None:
        self.reads += 1
        return self._head


def delivered(tenant: str, members: set[str], materialized: set[str] | None, shards: int) -> Delivered:
    by_shard: dict[int, list[str]] = {}
    for u in members:
        by_shard.setdefault(shard_of(u, shards), []).append(u)
    lists = {s: sorted(us) for s, us in by_shard.items()}
    frozen = None if materialized is None else frozenset(materialized)
    return Delivered(tenant, "g1", 9, {"seq": 9, "text": "hi", "pos": 77}, frozen, lists, shards)


def expected(sock: Socket, d: Delivered, head: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What one socket must receive: the message if its user was a member of the message's
    tenant's conversation, then the head if the user's entry was not materialized."""
    if sock.tenant != d.tenant or not d.was_member(sock.user_id):
        return []
    materialized = d.materialized is None or sock.user_id in d.materialized
    frames: list[dict[str, Any]] = [{"type": "MESSAGE", "materialized": materialized, "seq": 9, "text": "hi"}]
    if not materialized and head is not None:
        frames.append({"type": "HEAD", "conversation_id": "g1", **{k: head[k] for k in HEAD if k != "title"}})
    return frames


sockets = st.lists(st.tuples(st.sampled_from(TENANTS), st.sampled_from(USERS)), max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    open_=sockets,
    closed=st.sets(st.integers(0, 19)),
    tenant=st.sampled_from(TENANTS),
    members=st.sets(st.sampled_from(USERS)),
    silent=st.one_of(st.none(), st.sets(st.sampled_from(USERS))),
    shards=st.integers(1, 4),
    head=st.sampled_from([HEAD, None]),
)
def test_each_socket_gets_what_a_check_of_every_socket_gives(
    open_: list[tuple[str, str]],
    closed: set[int],
    tenant: str,
    members: set[str],
    silent: set[str] | None,
    shards: int,
    head: dict[str, Any] | None,
) -> None:
    views = Views(head)
    hub = PushHub(views)  # type: ignore[arg-type]
    socks = [Socket(t, u) for t, u in open_]
    for s in socks:
        hub.register(s)
    for i in closed & set(range(len(socks))):
        hub.unregister(socks[i])
    still = [s for i, s in enumerate(socks) if i not in closed]
    assert hub.online_count() == len(still)
    materialized = None if silent is None else members - silent
    d = delivered(tenant, members, materialized, shards)

    pushes = hub.deliver(d)

    for i, s in enumerate(socks):
        assert s.frames == ([] if i in closed else expected(s, d, head)), (s.tenant, s.user_id)
    assert pushes == sum(1 for s in still if expected(s, d, head))
    assert hub.pushes_total == pushes
    assert views.reads <= 1  # the head is read once a message, not once a socket


def test_a_tenants_last_socket_closed_leaves_nothing_behind() -> None:
    hub = PushHub(Views(None))  # type: ignore[arg-type]
    a, b = Socket("acme", "u1"), Socket("acme", "u1")
    hub.register(a)
    hub.register(b)
    hub.unregister(a)
    hub.unregister(a)  # twice: no error
    assert hub.online_count() == 1
    hub.unregister(b)
    hub.unregister(Socket("nobody", "u9"))
    assert hub.online_count() == 0 and hub._online == {}
    assert hub.deliver(delivered("acme", {"u1"}, None, 2)) == 0 and a.frames == b.frames == []


def test_both_walks_are_taken() -> None:
    """A message with fewer members than the tenant's online users walks its members; one
    with more walks the online users: both give the same sockets."""
    many_online = PushHub(Views(None))  # type: ignore[arg-type]
    few_online = PushHub(Views(None))  # type: ignore[arg-type]
    crowd = [Socket("acme", u) for u in USERS]
    for s in crowd:
        many_online.register(s)
    lone = Socket("acme", "u3")
    few_online.register(lone)
    d = delivered("acme", {"u3", "u4"}, None, 3)
    assert many_online.deliver(d) == 2 and few_online.deliver(d) == 1
    assert [s.user_id for s in crowd if s.frames] == ["u3", "u4"] and len(lone.frames) == 1
