"""RocksDB backend of the mailbox (rocksdict, raw bytes mode).

Why an LSM: a message's references land on N different users' key ranges. In a
user-keyed B-tree each insert dirties a different page (measured here: 70-100k
entries/s at 10M rows); an LSM appends the batch to its WAL and memtable and sorts
later, in the background (1.1M entries/s in the same run). See
docs/adr/0004-mailbox-store.md and bench/store_layouts.py.

Key   = MailboxShard u16 | len(tenant) u16 | tenant | user | 0x00 | pos u64  (big-endian)
Value = conversation_seq u64 | flags u8 | conversation_id utf-8

A user's entries are one contiguous key range in pos order: the inbox cursor is a
seek. The shard leads the key, so one message's references, grouped per shard and
sorted by user id within it (user ids hold no control characters), are written in
key order: RocksDB's memtable inserts sequential keys 2.5x faster than scattered
ones (measured, docs/PERFORMANCE.md).

RocksDB's failures come out of rocksdict as a bare Exception whose text is RocksDB's status
("IO error: While appending to file: ...: No space left on device"): the store raises them
as the port errors (`storage_error`), in its `except` clauses only (the write is per message)."""

from __future__ import annotations

import errno
import struct
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from projections.errors import StorageError, StorageFull, StorageIOError
from projections.ports import MailboxEntry, MessageRefs
from projections.sharding import shard_of

_U16 = struct.Struct(">H")
_POS = struct.Struct(">Q")
_VAL = struct.Struct(">QB")


_META_SHARDS = b"\xff\xff/meta/mailbox_shards"
# The highest message position any write batch held, put in each batch with its entries:
# after a power loss RocksDB recovers a prefix of its batches, and this key says how far
# that prefix reaches (written(); docs/adr/0056-embedded-power-loss.md).
_META_WRITTEN = b"\xff\xff/meta/written"

# Each write batch goes to the WAL without an fsync: a process crash (kill -9) loses nothing
# written, a power loss or kernel crash may lose the last writes the OS had not yet flushed.
# bench/durability.py prints it beside every bench's numbers.
SYNC_WRITES = False


def user_prefix(shard: int, tenant: str, user_id: str) -> bytes:
    t = tenant.encode()
    return _U16.pack(shard) + _U16.pack(len(t)) + t + user_id.encode() + b"\x00"


class ShardCountMismatch(RuntimeError):
    pass


_FULL_TEXT = ("no space left on device", "file too large", "disk quota exceeded")


def storage_error(exc: Exception) -> StorageError | None:
    """The port error of what rocksdict raised: a status of RocksDB's own (a bare Exception:
    an I/O error, or the OS's error it met), None for anything else."""
    if type(exc) is not Exception:
        return None
    text = str(exc)
    lowered = text.lower()
    if any(t in lowered for t in _FULL_TEXT):
        return StorageFull(text)
    if "io error" in lowered or "(os error" in lowered:
        return StorageIOError(text)
    return None


@contextmanager
def rocksdb_errors() -> Iterator[None]:
    """RocksDB's failures in the block raised as the port errors (off the per-message write)."""
    try:
        yield
    except Exception as exc:
        error = storage_error(exc)
        if error is None:
            raise
        raise error from exc


def _open(path: Path) -> Any:
    from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options, Rdict

    opt = Options(raw_mode=True)  # raw bytes, bytewise order: no pickling
    opt.create_if_missing(True)
    opt.increase_parallelism(2)
    opt.set_max_background_jobs(2)
    opt.set_write_buffer_size(64 << 20)
    opt.set_max_write_buffer_number(4)
    opt.set_level_compaction_dynamic_level_bytes(True)
    opt.set_compression_type(DBCompressionType.lz4())
    table = BlockBasedOptions()
    table.set_block_cache(Cache(64 << 20))
    opt.set_block_based_table_factory(table)
    return Rdict(str(path), opt)


def _written(db: Any) -> int | None:
    stored = db.get(_META_WRITTEN)
    return None if stored is None else int(_POS.unpack(stored)[0])


class RocksMailbox:
    def __init__(self, path: Path | str, shards: int = 16) -> None:
        from rocksdict import WriteOptions

        self.path = Path(path)
        self.shards = shards
        with rocksdb_errors():
            self.db = _open(self.path)
            stored = self.db.get(_META_SHARDS)
            if stored is None:
                self.db.put(_META_SHARDS, str(shards).encode())
        if stored is not None and int(stored) != shards:
            self.db.close()
            raise ShardCountMismatch(
                f"FANOUT_MAILBOX_SHARDS={shards}, but the mailbox at {self.path} was written with {int(stored)} "
                f"shards: set it back to {int(stored)} or run `fanout rebuild mailbox`"
            )
        self._written = _written(self.db)
        self._wo = WriteOptions()
        self._wo.sync = SYNC_WRITES
        self._prefixes: dict[str, dict[str, bytes]] = {}  # tenant -> user -> key prefix
        self._prefix_lists: dict[tuple[str, str, int], tuple[int, list[bytes]]] = {}
        self._lock = threading.Lock()

    def _prefix(self, tenant: str, user_id: str) -> bytes:
        per_tenant = self._prefixes.setdefault(tenant, {})
        p = per_tenant.get(user_id)
        if p is None:
            p = per_tenant[user_id] = user_prefix(shard_of(user_id, self.shards), tenant, user_id)
        return p

    def write(self, tenant: str, refs: MessageRefs) -> int:
        """The hot loop: one key concat and one put per recipient. The shards' groups go
        into one atomic WriteBatch (one WAL append): measured 1.8x faster here than a
        batch per shard, and a replay rewrites identical keys (idempotent)."""
        from rocksdict import WriteBatch

        posb = _POS.pack(refs.pos)
        cid = refs.conversation_id.encode()
        base_value = _VAL.pack(refs.seq, refs.flags) + cid
        wb = WriteBatch(raw_mode=True)
        n = 0
        for shard in sorted(refs.shards):
            prefixes = self._shard_prefixes(tenant, refs, shard)
            keys = [p + posb for p in prefixes]
            deque(map(wb.put, keys, [base_value] * len(keys)), maxlen=0)
            n += len(keys)
        for u, flags in refs.special.items():  # later puts of a key win within a batch
            wb.put(self._prefix(tenant, u) + posb, _VAL.pack(refs.seq, flags) + cid)
        written = refs.pos if self._written is None else max(self._written, refs.pos)
        wb.put(_META_WRITTEN, _POS.pack(written))
        try:
            self.db.write(wb, self._wo)
        except Exception as exc:
            error = storage_error(exc)
            if error is None:
                raise
            raise error from exc
        self._written = written
        return n

    def _shard_prefixes(self, tenant: str, refs: MessageRefs, shard: int) -> list[bytes]:
        """The key prefixes of one shard's recipients, cached per member-list version:
        in `always` a message's keys are then one bytes concat per member."""
        users = refs.shards[shard]
        version = refs.versions.get(shard) if refs.versions is not None else None
        key = (tenant, refs.conversation_id, shard)
        if version is not None:
            cached = self._prefix_lists.get(key)
            if cached is not None and cached[0] == version and len(cached[1]) == len(users):
                return cached[1]
        per_tenant = self._prefixes.setdefault(tenant, {})
        prefixes = [per_tenant.get(u) or self._prefix(tenant, u) for u in users]
        if version is not None:
            self._prefix_lists[key] = (version, prefixes)
        return prefixes

    def read(self, tenant: str, user_id: str, after: int, until: int, limit: int) -> list[MailboxEntry]:
        from rocksdict import ReadOptions

        if until <= after:
            return []
        prefix = self._prefix(tenant, user_id)
        ro = ReadOptions()
        ro.set_iterate_upper_bound(prefix + _POS.pack(until + 1))
        db = self.db
        if db is None:  # being reopened after a storage failure (the caller answers UNAVAILABLE)
            raise OSError(errno.EIO, f"mailbox store {self.path} is being reopened after an I/O error")
        n = len(prefix)
        out: list[MailboxEntry] = []
        with rocksdb_errors():
            it = db.iter(ro)
            it.seek(prefix + _POS.pack(after + 1))
            while it.valid() and len(out) < limit:
                k, v = it.key(), it.value()
                seq, flags = _VAL.unpack_from(v)
                out.append((user_id, _POS.unpack_from(k, n)[0], seq, v[9:].decode(), flags))
                it.next()
            del it
        return out

    def all_entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        """(tenant, user_id, pos, conversation_seq, conversation_id, flags) in key order."""
        with rocksdb_errors():
            yield from self._entries()

    def _entries(self) -> Iterator[tuple[str, str, int, int, str, int]]:
        it = self.db.iter()
        it.seek_to_first()
        while it.valid():
            k, v = it.key(), it.value()
            if k.startswith(b"\xff\xff"):
                break  # meta keys sort last
            (tl,) = _U16.unpack_from(k, 2)
            tenant = k[4 : 4 + tl].decode()
            end = k.index(b"\x00", 4 + tl)
            user = k[4 + tl : end].decode()
            (pos,) = _POS.unpack_from(k, end + 1)
            seq, flags = _VAL.unpack_from(v)
            yield tenant, user, pos, seq, v[9:].decode(), flags
            it.next()
        del it

    def written(self) -> int | None:
        return self._written

    def sort_key(self, tenant: str, user_id: str, pos: int) -> bytes:
        return self._prefix(tenant, user_id) + _POS.pack(pos)

    def count(self) -> int:
        return sum(1 for _ in self.all_entries())

    def flush(self) -> None:
        pass  # each write() is in the WAL before it returns

    def reopen(self) -> None:
        """RocksDB refuses every write after a failed WAL append (e.g. a full disk) until
        the database is reopened; reopening replays its WAL, so nothing acknowledged is lost."""
        with self._lock:
            if self.db is not None:
                self.db.close()
            self.db = None
            with rocksdb_errors():
                self.db = _open(self.path)
                self._written = _written(self.db)

    def close(self) -> None:
        with self._lock:
            if self.db is not None:
                self.db.close()
                self.db = None
