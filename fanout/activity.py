"""The activity refreshes of MARK_READ, group-committed (ADR-0018).

MARK_READ appends to the member's own MemberReadState stream, not to the conversation's.
The activity a read is (alpha, who is materialized in `mention_only`) is recorded on the
conversation only when the member's recorded activity is stale, and then group-committed:
a pending refresh rides on the next command this process writes to that conversation
(`FanoutApplication._apply_activity`), or is appended by this module's thread as ONE
Conversation.MembersActive per conversation every `interval` seconds, and on close. A crash
loses at most one interval of refreshes; the read seqs themselves are durable.

`PendingActivity` holds the refreshes and runs the thread; the application says how one
conversation's refreshes are appended (`flush_conversation`) and shares its command lock."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from domain.errors import NotFound

log = logging.getLogger("fanout.activity")

Key = tuple[str, str]  # (tenant, conversation_id)


class PendingActivity:
    def __init__(self, lock: threading.RLock, interval: float, flush_conversation: Callable[[str, str], int]) -> None:
        self.lock = lock  # the application's command lock: the map is read and changed under it
        self.interval = interval
        self._flush_conversation = flush_conversation
        self._pending: dict[Key, dict[str, float]] = {}  # (tenant, cid) -> user -> at
        self._flusher: threading.Thread | None = None
        self._closing = threading.Event()

    def of(self, key: Key) -> dict[str, float] | None:
        """The conversation's pending refreshes (user -> at), None when there are none."""
        return self._pending.get(key)

    def at(self, key: Key, user_id: str) -> float:
        """When the member's pending refresh was read (0.0: none pending)."""
        return self._pending.get(key, {}).get(user_id, 0.0)

    def add(self, key: Key, user_id: str, at: float) -> None:
        """Pend a refresh, to be recorded by the caller's own unit (interval 0)."""
        self._pending.setdefault(key, {})[user_id] = at

    def defer(self, key: Key, user_id: str, at: float) -> None:
        """Pend a refresh for the next command on the conversation or the next flush."""
        with self.lock:
            bucket = self._pending.setdefault(key, {})
            if at > bucket.get(user_id, 0.0):
                bucket[user_id] = at
            if self._flusher is None and not self._closing.is_set():
                self._flusher = threading.Thread(target=self._flush_loop, name="fanout-activity", daemon=True)
                self._flusher.start()

    def saved(self, key: Key, applied: dict[str, float]) -> None:
        """These refreshes are in the store: no longer pending (unless read again since)."""
        bucket = self._pending.get(key)
        if bucket is None:
            return
        for user, at in applied.items():
            if bucket.get(user) == at:
                del bucket[user]
        if not bucket:
            del self._pending[key]

    def count(self) -> int:
        """Members whose refresh is not appended yet."""
        with self.lock:
            return sum(len(b) for b in self._pending.values())

    def flush(self) -> int:
        """Append every pending refresh now: one Conversation.MembersActive per conversation.
        Returns the events appended. A conversation that fails stays pending (next interval);
        one that is gone is dropped."""
        appended = 0
        with self.lock:
            keys = list(self._pending)
        for key in keys:
            try:
                appended += self._flush_conversation(*key)
            except NotFound:
                with self.lock:
                    self._pending.pop(key, None)
            except Exception:  # the store is unavailable: keep it pending, retry next interval
                log.warning("activity of %s/%s not recorded yet", *key, exc_info=True)
        return appended

    def _flush_loop(self) -> None:
        """Runs while activity is pending: every interval, one MembersActive per conversation."""
        while not self._closing.wait(self.interval):
            with self.lock:
                if not self._pending:
                    self._flusher = None
                    return
            self.flush()
        with self.lock:
            self._flusher = None

    def close(self) -> None:
        """Stop the thread (waiting for a flush in progress); the caller flushes what is left."""
        self._closing.set()
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join(5)
