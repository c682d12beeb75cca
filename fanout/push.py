"""Online push: the O(O) socket writes. Called by the projection runner only after
a message's mailbox entries are durable (invariant O); frames go to each socket's
asyncio queue, thread-safely."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from projections.delivery import Delivered
from projections.ports import ViewReader


@dataclass(eq=False)
class Connection:
    tenant: str
    user_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    def send(self, frame: dict[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, frame)


class PushHub:
    """The sockets of this process, by tenant and user. `deliver` finds a message's online
    members by walking the smaller side: the message's members (looked up among the tenant's
    online users) or the tenant's online users (each checked against the members). A message
    costs O(min(members, online users of its tenant)), not O(every socket of the process):
    a replica holding 50,000 sockets used to test each of them for every 20-member message."""

    def __init__(self, views: ViewReader) -> None:
        self.views = views
        self._lock = threading.Lock()
        self._online: dict[str, dict[str, set[Connection]]] = {}  # tenant -> user -> open sockets
        self.pushes_total = 0

    def register(self, conn: Connection) -> None:
        with self._lock:
            self._online.setdefault(conn.tenant, {}).setdefault(conn.user_id, set()).add(conn)

    def unregister(self, conn: Connection) -> None:
        with self._lock:
            users = self._online.get(conn.tenant, {})
            conns = users.get(conn.user_id)
            if conns is not None:
                conns.discard(conn)
                if not conns:
                    del users[conn.user_id]
                    if not users:
                        del self._online[conn.tenant]

    def holds(self, tenant: str) -> bool:
        """Whether a socket of the tenant is open here (else its messages push nothing)."""
        with self._lock:
            return tenant in self._online

    def online_count(self) -> int:
        with self._lock:
            return sum(len(c) for users in self._online.values() for c in users.values())

    def _targets(self, d: Delivered) -> list[tuple[str, list[Connection]]]:
        """The online members of the message's tenant and their sockets (under the lock)."""
        with self._lock:
            users = self._online.get(d.tenant)
            if not users:
                return []
            lists = d.members_by_shard.values()
            if sum(map(len, lists)) <= len(users):
                return [(u, list(users[u])) for lst in lists for u in lst if u in users]
            return [(u, list(conns)) for u, conns in users.items() if d.was_member(u)]

    def deliver(self, d: Delivered) -> int:
        """Push one message to every online device of a member; returns socket writes."""
        pushes = 0
        head: dict[str, Any] | None = None
        for user, conns in self._targets(d):
            materialized = d.materialized is None or user in d.materialized
            frame = {"type": "MESSAGE", "materialized": materialized, **d.message}
            frame.pop("pos", None)
            for c in conns:
                c.send(frame)
                pushes += 1
                if not materialized:
                    if head is None:  # read once a message, for its first silent member online
                        found = self.views.head(d.tenant, d.conversation_id)
                        head = {} if found is None else {
                            "type": "HEAD",
                            "conversation_id": d.conversation_id,
                            "latest_conversation_seq": found["latest_conversation_seq"],
                            "last_activity_id": found["last_activity_id"],
                            "preview": found["preview"],
                        }  # fmt: skip
                    if head:
                        c.send(head)
        self.pushes_total += pushes
        return pushes

    def close(self) -> None:
        with self._lock:
            self._online.clear()
