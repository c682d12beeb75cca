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
    def __init__(self, views: ViewReader) -> None:
        self.views = views
        self._lock = threading.Lock()
        self._online: dict[tuple[str, str], set[Connection]] = {}
        self.pushes_total = 0

    def register(self, conn: Connection) -> None:
        with self._lock:
            self._online.setdefault((conn.tenant, conn.user_id), set()).add(conn)

    def unregister(self, conn: Connection) -> None:
        with self._lock:
            conns = self._online.get((conn.tenant, conn.user_id))
            if conns is not None:
                conns.discard(conn)
                if not conns:
                    del self._online[(conn.tenant, conn.user_id)]

    def online_count(self) -> int:
        with self._lock:
            return sum(len(c) for c in self._online.values())

    def deliver(self, d: Delivered) -> int:
        """Push one message to every online device of a member; returns socket writes."""
        with self._lock:
            targets = [
                (user, list(conns))
                for (tenant, user), conns in self._online.items()
                if tenant == d.tenant and d.was_member(user)
            ]
        pushes = 0
        for user, conns in targets:
            materialized = d.materialized is None or user in d.materialized
            frame = {"type": "MESSAGE", "materialized": materialized, **d.message}
            frame.pop("pos", None)
            for c in conns:
                c.send(frame)
                pushes += 1
                if not materialized:
                    head = self.views.head(d.tenant, d.conversation_id)
                    if head is not None:
                        c.send(
                            {
                                "type": "HEAD",
                                "conversation_id": d.conversation_id,
                                "latest_conversation_seq": head["latest_conversation_seq"],
                                "last_activity_id": head["last_activity_id"],
                                "preview": head["preview"],
                            }
                        )
        self.pushes_total += pushes
        return pushes

    def close(self) -> None:
        with self._lock:
            self._online.clear()
