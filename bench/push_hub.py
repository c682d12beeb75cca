"""What `PushHub.deliver` costs a replica for one message, by the sockets it holds (fanout/push.py).

    .venv/bin/python bench/push_hub.py
    .venv/bin/python bench/push_hub.py --online 1000,10000,50000 --members 20,1000,100000 --tenants 10

Every API replica (and the embedded runtime's process) hands each message's `Delivered` to its
hub, whatever the member count and whoever is online there. The hub keeps its sockets by tenant
and user and walks the smaller side (the message's members or the tenant's online users); the
naive hub this replaced tested every socket of the process against the message's members. Both
run here on the same sockets and messages (members drawn from users u0..u<users>, the online
users spread over --tenants, one socket each, nothing materialized withheld); the socket writes
are counted, not sent (a list append). Prints microseconds of CPU a message for each.

Then what a replica pays to decode a push record by member count (streams/push_records.py),
which a replica holding no socket of the record's tenant skips since its tenant header
(ADR-0055), against reading that header.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

from fanout.push import Connection, PushHub
from projections.delivery import Delivered
from projections.sharding import shard_of
from streams.push_records import TENANT_HEADER, decode, encode, tenant_of

SHARDS = 16


class Socket(Connection):
    def __init__(self, tenant: str, user_id: str) -> None:
        self.tenant = tenant
        self.user_id = user_id
        self.sent = 0

    def send(self, frame: dict[str, Any]) -> None:
        self.sent += 1


class NaiveHub(PushHub):
    """The hub before: every socket of the process tested against each message."""

    def _targets(self, d: Delivered) -> list[tuple[str, list[Connection]]]:
        with self._lock:
            return [
                (user, list(conns))
                for tenant, users in self._online.items()
                for user, conns in users.items()
                if tenant == d.tenant and d.was_member(user)
            ]


class Record:
    """What confluent-kafka hands the subscriber, as far as `tenant_of` reads it."""

    def __init__(self, headers: list[tuple[str, bytes]]) -> None:
        self._headers = headers

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


def message(tenant: str, members: list[str], seq: int) -> Delivered:
    by_shard: dict[int, list[str]] = {}
    for u in members:
        by_shard.setdefault(shard_of(u, SHARDS), []).append(u)
    lists = {s: sorted(us) for s, us in by_shard.items()}
    return Delivered(tenant, "g", seq, {"seq": seq, "text": "hi"}, None, lists, SHARDS)


def per_message(hub: PushHub, messages: list[Delivered]) -> tuple[float, int]:
    gc.collect()
    gc.freeze()  # the messages' member lists are not the hub's cost: no full collection walks them mid-timing
    t0 = time.process_time()
    pushes = sum(hub.deliver(d) for d in messages)
    return 1e6 * (time.process_time() - t0) / len(messages), pushes


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--online", default="100,1000,10000,50000", help="sockets the replica holds (comma-separated)")
    ap.add_argument("--members", default="20,1000,100000", help="members a message has (comma-separated)")
    ap.add_argument("--tenants", type=int, default=10, help="tenants the online users are spread over")
    ap.add_argument("--users", type=int, default=200_000, help="users a tenant's members and online users come from")
    ap.add_argument("--messages", type=int, default=200, help="messages timed for each cell (fewer for 100k members)")
    args = ap.parse_args()
    rng = random.Random(7)
    users = [f"u{i}" for i in range(args.users)]
    print(f"{args.tenants} tenants; the messages are the first tenant's; members drawn from {args.users:,} users")
    print(f"{'online':>8} {'members':>8} {'indexed us/msg':>15} {'naive us/msg':>13} {'pushes/msg':>11}")
    for online in (int(x) for x in args.online.split(",")):
        socks = [Socket(f"t{i % args.tenants}", u) for i, u in enumerate(rng.sample(users, online))]
        for m in (int(x) for x in args.members.split(",")):
            count = max(3, min(args.messages, 2_000_000 // max(m, online)))
            msgs = [message("t0", rng.sample(users, m), seq) for seq in range(count)]
            hubs: list[PushHub] = [PushHub(None), NaiveHub(None)]  # type: ignore[arg-type]
            for hub in hubs:
                for s in socks:
                    hub.register(s)
            # alternating, twice each, the faster of the two: the first pass warms the lists' memory
            timed = [per_message(hub, msgs) for _ in range(2) for hub in hubs]
            (fast, pushes), (slow, naive_pushes) = min(timed[0], timed[2]), min(timed[1], timed[3])
            assert pushes == naive_pushes, (pushes, naive_pushes)
            print(f"{online:>8,} {m:>8,} {fast:>15,.1f} {slow:>13,.1f} {pushes / count:>11,.1f}", flush=True)
    print(f"\n{'members':>8} {'record bytes':>13} {'decode us':>10} {'header us':>10}")
    for m in (int(x) for x in args.members.split(",")):
        d = message("t0", rng.sample(users, m), 1)
        record, msg = encode(d), Record([(TENANT_HEADER, b"t0")])
        count = max(3, 200_000 // m)
        t0 = time.process_time()
        for _ in range(count):
            decode(record)
        t1 = time.process_time()
        for _ in range(count):
            tenant_of(msg)
        t2 = time.process_time()
        print(
            f"{m:>8,} {len(record):>13,} {1e6 * (t1 - t0) / count:>10,.1f} {1e6 * (t2 - t1) / count:>10,.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
