"""MailboxShard assignment: stable across processes and runtimes (crc32, not hash())."""

from __future__ import annotations

import zlib


def shard_of(user_id: str, shards: int) -> int:
    return zlib.crc32(user_id.encode()) % shards
