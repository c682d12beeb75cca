#!/usr/bin/env python3
"""Where should the embedded runtime keep its mailbox references (UserMailboxEntry)?

One mailbox entry = one small row per (recipient user, message):
    key   = (user, pos, conversation_seq)   pos = global event position (int64, grows per message)
    value = conversation_id (short str) + flags byte (mention/reply/announcement/own)
Read path: "inbox by user" = entries of one user with pos > cursor, in pos order, LIMIT 200,
served by an index / key-prefix seek (never a full scan).

Workload (same data for every layout):
  * prefill: --prefill-messages messages fanned out into one group of --members users
    (u000000..), i.e. prefill_messages * members entries (10M with the defaults);
  * measured: --messages further messages into the same group, each message written
    as ONE atomic, durable-at-commit batch (SQLite: one transaction in WAL mode with
    synchronous=NORMAL; RocksDB: one WriteBatch, WAL on, sync=False);
  * reads: --reads random members, inbox page of 200 from cursor 0 ("read200") and
    from the last prefill position ("recent", returns only the --messages new ones).

Every layout runs in its own spawned child process so that peak RSS and caches are
per layout. Peak RSS is the kernel's VmHWM reset (via /proc/self/clear_refs) right
before the measured phase, cross-checked with a 20 ms psutil sampler.

Layouts (one function each, the hot loop is in the nested `write_message`):
  python_only      Python-side ceiling: building keys/rows (and WriteBatch.put) without a store
  sqlite_naive     user-keyed WITHOUT ROWID table, execute() per member + per-member counter upsert
  sqlite_batch_4k  same table, executemany over key-sorted rows, page_size 4096, 256 MiB cache, mmap
  sqlite_batch_16k ... page_size 16384
  sqlite_batch_64k ... page_size 65536
  sqlite_log_index append-ordered table keyed (pos, uid, seq) + secondary index (uid, pos, seq)
  sqlite_bucketed  table keyed (bucket, uid, pos, seq); a new bucket is opened every
                   --bucket-entries entries, so a write only dirties the small, hot bucket
  rocks_str        RocksDB (rocksdict, raw mode): key = user_id utf8 + 0x00 + pos>Q + seq>I
  rocks_int        RocksDB (rocksdict, raw mode): key = uid>I (integer surrogate) + pos>Q + seq>I
  rocks_int_fsync  rocks_int with WriteOptions.sync=True (fsync of the WAL per message)

Example:
  .venv/bin/python bench/store_layouts.py --prefill-messages 100 --members 100000 --messages 20
  .venv/bin/python bench/store_layouts.py --prefill-messages 10 --members 20000 --messages 5   # quick
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import multiprocessing as mp
import os
import random
import shutil
import sqlite3
import statistics
import struct
import sys
import threading
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

FLAG_MENTION, FLAG_REPLY, FLAG_ANNOUNCEMENT, FLAG_OWN = 1, 2, 4, 8
POS_BASE, POS_STRIDE = 1_000_000, 7  # pos of message m = POS_BASE + m*POS_STRIDE (other events interleave)
PACK_QI = struct.Struct(">QI").pack  # pos (8 bytes BE) + seq (4 bytes BE)
UNPACK_QI = struct.Struct(">QI").unpack_from


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    members: int
    prefill_messages: int
    messages: int
    reads: int
    read_limit: int
    bucket_entries: int
    rocks_write_buffer_mb: int = 64
    seed: int = 1
    conv_id: str = "c-g000001"

    @property
    def measured(self) -> range:
        return range(self.prefill_messages, self.prefill_messages + self.messages)

    def pos(self, m: int) -> int:
        return POS_BASE + m * POS_STRIDE

    def seq(self, m: int) -> int:
        return m + 1

    def flag_overrides(self, m: int) -> dict[int, int]:
        """member index -> flags for the few recipients that differ from 0 (sender, mentions)."""
        n = self.members
        return {(m * 7919) % n: FLAG_OWN, (m * 104729 + 1) % n: FLAG_MENTION,
                (m * 1299709 + 2) % n: FLAG_MENTION | FLAG_REPLY}

    def users(self) -> list[str]:
        return [f"u{i:06d}" for i in range(self.members)]

    def read_users(self) -> list[int]:
        rng = random.Random(self.seed)
        return [rng.randrange(self.members) for _ in range(self.reads)]

    def verify_users(self) -> list[int]:
        return [0, self.members // 3, self.members - 1]


# --------------------------------------------------------------------------- measurement helpers


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler(threading.Thread):
    def __init__(self, interval: float = 0.02):
        super().__init__(daemon=True)
        self.proc, self.interval, self.peak = psutil.Process(), interval, 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self._halt.wait(self.interval)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return max(self.peak, self.proc.memory_info().rss)


def disk_size(*paths: Path) -> int:
    total = 0
    for p in paths:
        if p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        elif p.exists():
            total += p.stat().st_size
    return total


def measure(wl: Workload, write_message, read_inbox) -> dict:
    """Drive the measured phase.

    write_message(m) must build and durably commit message m; it may return the seconds it spent
    building keys/rows in Python (reported as 'build ms'). read_inbox(i, cursor) -> list of rows.
    """
    proc = psutil.Process()
    hwm_ok = _reset_peak_rss()
    sampler = RssSampler()
    sampler.start()
    lat, build = [], []
    io0 = proc.io_counters().write_bytes
    t_all = time.perf_counter()
    for m in wl.measured:
        t0 = time.perf_counter()
        b = write_message(m)
        lat.append(time.perf_counter() - t0)
        if b is not None:
            build.append(b)
    total = time.perf_counter() - t_all
    written = proc.io_counters().write_bytes - io0  # includes RocksDB background flush/compaction

    def timed_reads(cursor: int):
        rl, nrows = [], 0
        for i in wl.read_users():
            t0 = time.perf_counter()
            rows = read_inbox(i, cursor)
            rl.append(time.perf_counter() - t0)
            nrows += len(rows)
        rl.sort()
        return rl[len(rl) // 2], rl[min(len(rl) - 1, int(len(rl) * 0.99))], nrows / max(1, len(rl))

    r_p50, r_p99, r_rows = timed_reads(0)
    recent_cursor = wl.pos(wl.prefill_messages - 1) if wl.prefill_messages else 0
    c_p50, c_p99, c_rows = timed_reads(recent_cursor)
    peak = max(sampler.stop(), _vm_hwm() if hwm_ok else 0)

    digest = hashlib.sha1()
    for i in wl.verify_users():
        for row in read_inbox(i, 0):
            digest.update(repr(tuple(row)).encode())
    return ({"build_ms": 1e3 * statistics.fmean(build)} if build else {}) | {
        "entries_s": wl.messages * wl.members / total if total else 0.0,
        "msg_mean_ms": 1e3 * statistics.fmean(lat) if lat else 0.0,
        "msg_max_ms": 1e3 * max(lat) if lat else 0.0,
        "written_msg": written / max(1, wl.messages),
        "peak_rss": peak,
        "read_p50_us": 1e6 * r_p50, "read_p99_us": 1e6 * r_p99, "read_rows": r_rows,
        "recent_p50_us": 1e6 * c_p50, "recent_p99_us": 1e6 * c_p99, "recent_rows": c_rows,
        "verify": digest.hexdigest()[:10],
    }


# --------------------------------------------------------------------------- SQLite helpers

TEXT_SCHEMA = """
CREATE TABLE mailbox(user_id TEXT, pos INTEGER, seq INTEGER, conversation_id TEXT, flags INTEGER,
                     PRIMARY KEY(user_id, pos, seq)) WITHOUT ROWID;
CREATE TABLE user_state(user_id TEXT, conversation_id TEXT, unread INTEGER,
                        PRIMARY KEY(user_id, conversation_id)) WITHOUT ROWID;
"""
TEXT_INSERT = "INSERT INTO mailbox VALUES (?,?,?,?,?)"
TEXT_READ = ("SELECT pos, seq, conversation_id, flags FROM mailbox "
             "WHERE user_id=? AND pos>? ORDER BY pos, seq LIMIT ?")

LOG_SCHEMA = """
CREATE TABLE mailbox_log(pos INTEGER, uid INTEGER, seq INTEGER, conversation_id TEXT, flags INTEGER,
                         PRIMARY KEY(pos, uid, seq)) WITHOUT ROWID;
CREATE TABLE users(user_id TEXT PRIMARY KEY, uid INTEGER NOT NULL) WITHOUT ROWID;
"""
LOG_INDEX = "CREATE INDEX mailbox_by_user ON mailbox_log(uid, pos, seq)"
LOG_INSERT = "INSERT INTO mailbox_log VALUES (?,?,?,?,?)"
LOG_READ = ("SELECT pos, seq, conversation_id, flags FROM mailbox_log "
            "WHERE uid=? AND pos>? ORDER BY pos, seq LIMIT ?")

BUCKET_SCHEMA = """
CREATE TABLE mailbox_b(bucket INTEGER, uid INTEGER, pos INTEGER, seq INTEGER, conversation_id TEXT,
                       flags INTEGER, PRIMARY KEY(bucket, uid, pos, seq)) WITHOUT ROWID;
CREATE TABLE buckets(bucket INTEGER PRIMARY KEY, first_pos INTEGER NOT NULL, entries INTEGER NOT NULL);
CREATE TABLE users(user_id TEXT PRIMARY KEY, uid INTEGER NOT NULL) WITHOUT ROWID;
"""
BUCKET_INSERT = "INSERT INTO mailbox_b VALUES (?,?,?,?,?,?)"
BUCKET_READ = ("SELECT pos, seq, conversation_id, flags FROM mailbox_b "
               "WHERE bucket=? AND uid=? AND pos>? ORDER BY pos, seq LIMIT ?")
BUCKET_UPSERT = ("INSERT INTO buckets VALUES (?,?,?) ON CONFLICT(bucket) "
                 "DO UPDATE SET entries = entries + excluded.entries")

CACHE_256MIB = -262144


def sqlite_open_bulk(path: Path, page_size: int) -> sqlite3.Connection:
    """Prefill-only connection: no journal, no sync (the file is thrown away on failure)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute(f"PRAGMA page_size={page_size}")
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute(f"PRAGMA cache_size={CACHE_256MIB}")
    return con


def sqlite_open_wal(path: Path, cache_size: int | None, mmap_size: int = 0) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)  # explicit BEGIN/COMMIT below
    assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    con.execute("PRAGMA synchronous=NORMAL")
    if cache_size is not None:
        con.execute(f"PRAGMA cache_size={cache_size}")
    if mmap_size:
        con.execute(f"PRAGMA mmap_size={mmap_size}")
    return con


def check_plan(con: sqlite3.Connection, sql: str, params) -> str:
    plan = " | ".join(r[-1] for r in con.execute("EXPLAIN QUERY PLAN " + sql, params))
    assert "SEARCH" in plan and "SCAN" not in plan.replace("SCAN CONSTANT", ""), plan
    return plan


def prefill_template(ctx: dict, name: str, build) -> tuple[Path, float]:
    """Build (once per run) a prefilled template DB and return a fresh copy of it for this layout."""
    tpl = ctx["workdir"] / f"template-{name}.db"
    t_start = t0 = time.perf_counter()
    if not tpl.exists():
        tmp = tpl.with_suffix(".building")
        tmp.unlink(missing_ok=True)
        build(tmp)
        tmp.rename(tpl)
        ctx["notes"].append(f"prefill {name}: built in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
    dst = ctx["workdir"] / f"{ctx['layout']}.db"
    shutil.copyfile(tpl, dst)
    ctx["notes"].append(f"copied template {name} in {time.perf_counter() - t0:.1f}s")
    return dst, time.perf_counter() - t_start


def build_text_template(wl: Workload, page_size: int):
    def build(path: Path):
        con = sqlite_open_bulk(path, page_size)
        con.executescript(TEXT_SCHEMA)
        users, conv, P = wl.users(), wl.conv_id, wl.prefill_messages
        msgs = [(wl.pos(m), wl.seq(m), wl.flag_overrides(m)) for m in range(P)]
        con.execute("BEGIN")
        con.executemany(TEXT_INSERT, ((u, pos, seq, conv, ov.get(i, 0))   # sorted by PK
                                      for i, u in enumerate(users) for pos, seq, ov in msgs))
        con.executemany("INSERT INTO user_state VALUES (?,?,?)", ((u, conv, P) for u in users))
        con.execute("COMMIT")
        con.close()
    return build


# --------------------------------------------------------------------------- layouts


def layout_python_only(wl: Workload, ctx: dict) -> list[dict]:
    """Ceiling: Python-side cost of producing one message's entries, no store at all."""
    from rocksdict import WriteBatch

    users, conv = wl.users(), wl.conv_id
    prefixes = [i.to_bytes(4, "big") for i in range(wl.members)]
    conv_b = conv.encode()
    out = []

    def run(label, fn):
        t0 = time.perf_counter()
        for m in wl.measured:
            fn(m)
        dt = time.perf_counter() - t0
        out.append({"layout": f"python_only:{label}", "entries_s": wl.messages * wl.members / dt,
                    "msg_mean_ms": 1e3 * dt / wl.messages})

    def rocks_keys(m):
        suffix = PACK_QI(wl.pos(m), wl.seq(m))
        keys = [p + suffix for p in prefixes]
        vals = [b"\x00" + conv_b] * len(keys)
        for i, f in wl.flag_overrides(m).items():
            vals[i] = bytes((f,)) + conv_b
        return keys, vals

    def rocks_keys_and_batch(m):
        keys, vals = rocks_keys(m)
        wb = WriteBatch(raw_mode=True)
        deque(map(wb.put, keys, vals), maxlen=0)

    def rocks_keys_and_batch_forloop(m):
        keys, vals = rocks_keys(m)
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        for k, v in zip(keys, vals, strict=True):
            put(k, v)

    def sqlite_rows(m):
        pos, seq = wl.pos(m), wl.seq(m)
        rows = [(u, pos, seq, conv, 0) for u in users]
        for i, f in wl.flag_overrides(m).items():
            rows[i] = (users[i], pos, seq, conv, f)

    run("rocks_keys", rocks_keys)
    run("rocks_keys+WriteBatch(map)", rocks_keys_and_batch)
    run("rocks_keys+WriteBatch(for)", rocks_keys_and_batch_forloop)
    run("sqlite_rows", sqlite_rows)
    return out


def layout_sqlite_naive(wl: Workload, ctx: dict) -> dict:
    """The naive writer: one execute() per member + per-member unread counter upsert. Default cache."""
    path, prefill_s = prefill_template(ctx, "text-4096", build_text_template(wl, 4096))
    con = sqlite_open_wal(path, cache_size=None)
    cur = con.cursor()
    users, conv = wl.users(), wl.conv_id
    upsert = ("INSERT INTO user_state VALUES (?,?,1) ON CONFLICT(user_id, conversation_id) "
              "DO UPDATE SET unread = unread + 1")

    def write_message(m):
        pos, seq, ov = wl.pos(m), wl.seq(m), wl.flag_overrides(m)
        cur.execute("BEGIN")
        for i, u in enumerate(users):                      # hot loop: 2 statements per member
            cur.execute(TEXT_INSERT, (u, pos, seq, conv, ov.get(i, 0)))
            cur.execute(upsert, (u, conv))
        cur.execute("COMMIT")

    def read_inbox(i, cursor):
        return cur.execute(TEXT_READ, (users[i], cursor, wl.read_limit)).fetchall()

    ctx["notes"].append("plan: " + check_plan(con, TEXT_READ, ("u000001", 0, 200)))
    res = measure(wl, write_message, read_inbox)
    cur.close()
    con.close()
    return res | {"disk": disk_size(path), "prefill_s": prefill_s,
                  "settings": "page 4096, default cache, WAL+NORMAL"}


def _sqlite_batched(wl: Workload, ctx: dict, page_size: int) -> dict:
    path, prefill_s = prefill_template(ctx, f"text-{page_size}", build_text_template(wl, page_size))
    con = sqlite_open_wal(path, cache_size=CACHE_256MIB, mmap_size=1 << 30)
    users, conv = wl.users(), wl.conv_id

    def write_message(m):
        t0 = time.perf_counter()
        pos, seq = wl.pos(m), wl.seq(m)
        rows = [(u, pos, seq, conv, 0) for u in users]     # users sorted -> rows sorted by PK
        for i, f in wl.flag_overrides(m).items():
            rows[i] = (users[i], pos, seq, conv, f)
        t_build = time.perf_counter() - t0
        con.execute("BEGIN")
        con.executemany(TEXT_INSERT, rows)                 # hot loop runs in C
        con.execute("COMMIT")
        return t_build

    def read_inbox(i, cursor):
        return con.execute(TEXT_READ, (users[i], cursor, wl.read_limit)).fetchall()

    res = measure(wl, write_message, read_inbox)
    con.close()
    return res | {"disk": disk_size(path), "prefill_s": prefill_s,
                  "settings": f"page {page_size}, cache 256MiB, mmap 1GiB, WAL+NORMAL"}


def layout_sqlite_batch_4k(wl, ctx):
    return _sqlite_batched(wl, ctx, 4096)


def layout_sqlite_batch_16k(wl, ctx):
    return _sqlite_batched(wl, ctx, 16384)


def layout_sqlite_batch_64k(wl, ctx):
    return _sqlite_batched(wl, ctx, 65536)


def layout_sqlite_log_index(wl: Workload, ctx: dict) -> dict:
    """Append-ordered table (pos, uid, seq) + secondary index (uid, pos, seq); uid = int surrogate."""
    def build(path: Path):
        con = sqlite_open_bulk(path, 4096)
        con.executescript(LOG_SCHEMA)
        conv = wl.conv_id
        con.execute("BEGIN")
        con.executemany("INSERT INTO users VALUES (?,?)", ((u, i) for i, u in enumerate(wl.users())))
        for m in range(wl.prefill_messages):
            pos, seq, ov = wl.pos(m), wl.seq(m), wl.flag_overrides(m)
            con.executemany(LOG_INSERT, ((pos, i, seq, conv, ov.get(i, 0)) for i in range(wl.members)))
        con.execute(LOG_INDEX)  # built after the load: one sort instead of 10M random inserts
        con.execute("COMMIT")
        con.close()

    path, prefill_s = prefill_template(ctx, "log-index-4096", build)
    con = sqlite_open_wal(path, cache_size=CACHE_256MIB, mmap_size=1 << 30)
    conv, uids = wl.conv_id, range(wl.members)

    def write_message(m):
        t0 = time.perf_counter()
        pos, seq = wl.pos(m), wl.seq(m)
        rows = [(pos, uid, seq, conv, 0) for uid in uids]  # appended at the end of the table
        for i, f in wl.flag_overrides(m).items():
            rows[i] = (pos, i, seq, conv, f)
        t_build = time.perf_counter() - t0
        con.execute("BEGIN")
        con.executemany(LOG_INSERT, rows)                  # + one random insert per row into the index
        con.execute("COMMIT")
        return t_build

    def read_inbox(i, cursor):
        return con.execute(LOG_READ, (i, cursor, wl.read_limit)).fetchall()

    ctx["notes"].append("plan: " + check_plan(con, LOG_READ, (1, 0, 200)))
    res = measure(wl, write_message, read_inbox)
    con.close()
    return res | {"disk": disk_size(path), "prefill_s": prefill_s,
                  "settings": "page 4096, cache 256MiB, mmap 1GiB, WAL+NORMAL, int uid"}


class Buckets:
    """Bucket directory: a new bucket starts once the current one holds >= cap entries."""

    def __init__(self, cap: int):
        self.cap, self.first_pos, self.count = cap, [], 0

    def assign(self, pos: int, n: int) -> int:
        if not self.first_pos or self.count >= self.cap:
            self.first_pos.append(pos)
            self.count = 0
        self.count += n
        return len(self.first_pos) - 1

    def from_cursor(self, cursor: int) -> range:
        """Bucket ids that can hold entries with pos > cursor, oldest first."""
        start = max(0, bisect.bisect_right(self.first_pos, cursor + 1) - 1)
        return range(start, len(self.first_pos))


def layout_sqlite_bucketed(wl: Workload, ctx: dict) -> dict:
    """Key (bucket, uid, pos, seq): writes only touch the hot bucket's pages; reads seek per bucket."""
    conv = wl.conv_id

    def build(path: Path):
        con = sqlite_open_bulk(path, 4096)
        con.executescript(BUCKET_SCHEMA)
        b = Buckets(wl.bucket_entries)
        per_bucket: dict[int, list] = {}
        for m in range(wl.prefill_messages):
            bid = b.assign(wl.pos(m), wl.members)
            per_bucket.setdefault(bid, []).append((wl.pos(m), wl.seq(m), wl.flag_overrides(m)))
        con.execute("BEGIN")
        con.executemany("INSERT INTO users VALUES (?,?)", ((u, i) for i, u in enumerate(wl.users())))
        for bid, msgs in per_bucket.items():
            con.executemany(BUCKET_INSERT, ((bid, i, pos, seq, conv, ov.get(i, 0))   # sorted by PK
                                            for i in range(wl.members) for pos, seq, ov in msgs))
            con.execute(BUCKET_UPSERT, (bid, b.first_pos[bid], len(msgs) * wl.members))
        con.execute("COMMIT")
        con.close()

    path, prefill_s = prefill_template(ctx, f"bucketed-{wl.bucket_entries}", build)
    con = sqlite_open_wal(path, cache_size=CACHE_256MIB, mmap_size=1 << 30)
    buckets = Buckets(wl.bucket_entries)                    # reload the directory (tiny)
    for _bid, first_pos, entries in con.execute("SELECT * FROM buckets ORDER BY bucket"):
        buckets.first_pos.append(first_pos)
        buckets.count = entries
    uids = range(wl.members)

    def write_message(m):
        t0 = time.perf_counter()
        pos, seq = wl.pos(m), wl.seq(m)
        bid = buckets.assign(pos, wl.members)
        rows = [(bid, uid, pos, seq, conv, 0) for uid in uids]
        for i, f in wl.flag_overrides(m).items():
            rows[i] = (bid, i, pos, seq, conv, f)
        t_build = time.perf_counter() - t0
        con.execute("BEGIN")
        con.executemany(BUCKET_INSERT, rows)
        con.execute(BUCKET_UPSERT, (bid, pos, wl.members))
        con.execute("COMMIT")
        return t_build

    def read_inbox(i, cursor):
        out, limit = [], wl.read_limit
        for bid in buckets.from_cursor(cursor):
            out += con.execute(BUCKET_READ, (bid, i, cursor, limit - len(out))).fetchall()
            if len(out) >= limit:
                break
        return out

    ctx["notes"].append("plan: " + check_plan(con, BUCKET_READ, (0, 1, 0, 200)))
    res = measure(wl, write_message, read_inbox)
    ctx["notes"].append(f"buckets at end: {len(buckets.first_pos)}")
    con.close()
    return res | {"disk": disk_size(path), "prefill_s": prefill_s,
                  "settings": f"page 4096, cache 256MiB, mmap 1GiB, WAL+NORMAL, int uid, "
                              f"bucket={wl.bucket_entries} entries"}


def rocks_open(path: Path, write_buffer_mb: int):
    from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options, Rdict

    opt = Options(raw_mode=True)        # raw bytes keys/values: no pickling, bytewise comparator
    opt.create_if_missing(True)
    opt.increase_parallelism(2)
    opt.set_max_background_jobs(2)
    opt.set_write_buffer_size(write_buffer_mb << 20)
    opt.set_max_write_buffer_number(4)
    opt.set_level_compaction_dynamic_level_bytes(True)
    opt.set_compression_type(DBCompressionType.lz4())
    table = BlockBasedOptions()
    table.set_block_cache(Cache(64 << 20))
    opt.set_block_based_table_factory(table)
    return Rdict(str(path), opt)


def _rocks(wl: Workload, ctx: dict, prefixes: list[bytes], uppers: list[bytes], encoding: str,
           sync: bool = False) -> dict:
    from rocksdict import ReadOptions, WriteBatch, WriteOptions

    path = ctx["workdir"] / ctx["layout"]
    shutil.rmtree(path, ignore_errors=True)
    conv_b = wl.conv_id.encode()
    db = rocks_open(path, wl.rocks_write_buffer_mb)

    def batch_for(m) -> WriteBatch:
        suffix = PACK_QI(wl.pos(m), wl.seq(m))
        vals = [b"\x00" + conv_b] * len(prefixes)
        for i, f in wl.flag_overrides(m).items():
            vals[i] = bytes((f,)) + conv_b
        wb = WriteBatch(raw_mode=True)                      # must match the DB's raw mode
        deque(map(wb.put, [p + suffix for p in prefixes], vals), maxlen=0)  # hot loop: 1 concat + 1 put
        return wb

    # prefill: same batches, WAL off (bulk), then flush + full compaction -> a settled LSM tree
    t0 = time.perf_counter()
    bulk = WriteOptions()
    bulk.disable_wal = True
    for m in range(wl.prefill_messages):
        db.write(batch_for(m), bulk)
    db.flush()
    db.compact_range(None, None)
    prefill_s = time.perf_counter() - t0
    ctx["notes"].append(f"rocks prefill (write+flush+compact) {prefill_s:.1f}s")

    durable = WriteOptions()
    durable.sync = sync            # False: WAL on, no fsync per commit (~ SQLite WAL synchronous=NORMAL)
    durable.disable_wal = False    # the WAL on (True would write no WAL at all, as the bulk prefill above)

    def write_message(m):
        t0 = time.perf_counter()
        wb = batch_for(m)
        t_build = time.perf_counter() - t0
        db.write(wb, durable)                                # one atomic WriteBatch per message
        return t_build

    def read_inbox(i, cursor):
        ro = ReadOptions()
        ro.set_iterate_upper_bound(uppers[i])               # stay inside this user's key prefix
        it = db.iter(ro)
        prefix = prefixes[i]
        n = len(prefix)
        it.seek(prefix + (cursor + 1).to_bytes(8, "big"))
        out = []
        while it.valid() and len(out) < wl.read_limit:
            k, v = it.key(), it.value()
            pos, seq = UNPACK_QI(k, n)
            out.append((pos, seq, v[1:].decode(), v[0]))
            it.next()
        del it                                                # a live iterator keeps the DB open
        return out

    res = measure(wl, write_message, read_inbox)
    l0 = db.property_int_value("rocksdb.num-files-at-level0")
    pending = (db.property_int_value("rocksdb.estimate-pending-compaction-bytes") or 0) >> 20
    ctx["notes"].append(f"rocks after run: L0 files={l0}, est. pending compaction={pending} MiB")
    db.close()
    return res | {"disk": disk_size(path), "prefill_s": prefill_s,
                  "settings": f"{encoding}; WAL on, sync={sync}; write buffer "
                              f"{wl.rocks_write_buffer_mb}MiB x4, lz4, 64MiB block cache"}


def layout_rocks_str(wl: Workload, ctx: dict) -> dict:
    users = [u.encode() for u in wl.users()]
    return _rocks(wl, ctx, [u + b"\x00" for u in users], [u + b"\x01" for u in users],
                  "key=user_id utf8+0x00+pos>Q+seq>I (20B)")


def layout_rocks_int(wl: Workload, ctx: dict) -> dict:
    return _rocks(wl, ctx, [i.to_bytes(4, "big") for i in range(wl.members)],
                  [(i + 1).to_bytes(4, "big") for i in range(wl.members)],
                  "key=uid>I+pos>Q+seq>I (16B)")


def layout_rocks_int_fsync(wl: Workload, ctx: dict) -> dict:
    """rocks_int with WriteOptions.sync=True: one WAL fsync per message (power-loss durable)."""
    return _rocks(wl, ctx, [i.to_bytes(4, "big") for i in range(wl.members)],
                  [(i + 1).to_bytes(4, "big") for i in range(wl.members)],
                  "key=uid>I+pos>Q+seq>I (16B)", sync=True)


LAYOUTS = {
    "python_only": layout_python_only,
    "sqlite_naive": layout_sqlite_naive,
    "sqlite_batch_4k": layout_sqlite_batch_4k,
    "sqlite_batch_16k": layout_sqlite_batch_16k,
    "sqlite_batch_64k": layout_sqlite_batch_64k,
    "sqlite_log_index": layout_sqlite_log_index,
    "sqlite_bucketed": layout_sqlite_bucketed,
    "rocks_str": layout_rocks_str,
    "rocks_int": layout_rocks_int,
    "rocks_int_fsync": layout_rocks_int_fsync,
}


# --------------------------------------------------------------------------- driver


def _child(name: str, wl: Workload, workdir: str) -> tuple[list[dict], list[str]]:
    ctx = {"workdir": Path(workdir), "layout": name, "notes": []}
    t0 = time.perf_counter()
    res = LAYOUTS[name](wl, ctx)
    rows = res if isinstance(res, list) else [res | {"layout": name}]
    ctx["notes"].append(f"wall {time.perf_counter() - t0:.1f}s")
    return rows, ctx["notes"]


def fmt_table(rows: list[dict]) -> str:
    cols = [("layout", "layout", "{}"), ("entries/s", "entries_s", "{:,.0f}"),
            ("msg mean ms", "msg_mean_ms", "{:.1f}"), ("msg max ms", "msg_max_ms", "{:.1f}"),
            ("build ms", "build_ms", "{:.1f}"), ("MiB written/msg", "written_msg", "{:.1f}"),
            ("peak RSS MiB", "peak_rss", "{:.0f}"), ("disk MiB", "disk", "{:.0f}"),
            ("read200 p50 us", "read_p50_us", "{:.0f}"), ("p99 us", "read_p99_us", "{:.0f}"),
            ("rows", "read_rows", "{:.0f}"), ("recent p50 us", "recent_p50_us", "{:.0f}"),
            ("p99 us", "recent_p99_us", "{:.0f}"), ("verify", "verify", "{}")]
    mib = {"peak_rss", "disk", "written_msg"}
    table = [[h for h, _, _ in cols]]
    for r in rows:
        table.append([(f.format(r[k] / 2**20 if k in mib else r[k]) if k in r else "-") for _, k, f in cols])
    widths = [max(len(row[c]) for row in table) for c in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) if c else cell.ljust(w)
                       for c, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100_000, help="group size (default 100000)")
    ap.add_argument("--prefill-messages", type=int, default=100, help="messages stored before measuring")
    ap.add_argument("--messages", type=int, default=20, help="measured messages (default 20)")
    ap.add_argument("--reads", type=int, default=1000, help="inbox reads per read test (default 1000)")
    ap.add_argument("--read-limit", type=int, default=200)
    ap.add_argument("--bucket-entries", type=int, default=1_000_000,
                    help="sqlite_bucketed: entries per bucket before a new one is opened")
    ap.add_argument("--rocks-write-buffer-mb", type=int, default=64,
                    help="RocksDB write_buffer_size in MiB (max_write_buffer_number=4)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help="comma separated subset of: " + ", ".join(LAYOUTS))
    ap.add_argument("--workdir", default="/tmp/fanout_store_bench")
    ap.add_argument("--keep", action="store_true", help="keep the data files in --workdir")
    args = ap.parse_args(argv)

    names = [n.strip() for n in args.layouts.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layouts: {unknown}")
    wl = Workload(members=args.members, prefill_messages=args.prefill_messages, messages=args.messages,
                  reads=args.reads, read_limit=args.read_limit, bucket_entries=args.bucket_entries,
                  rocks_write_buffer_mb=args.rocks_write_buffer_mb)
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    print(f"workload: {wl.members:,} members, prefill {wl.prefill_messages} msgs "
          f"({wl.members * wl.prefill_messages:,} entries), measure {wl.messages} msgs "
          f"({wl.members * wl.messages:,} entries); python {sys.version.split()[0]}, "
          f"sqlite {sqlite3.sqlite_version}, cpus {os.cpu_count()}, loadavg {os.getloadavg()[0]:.2f}", flush=True)

    results, t_start = [], time.perf_counter()
    try:
        for name in names:
            # one fresh process per layout: isolated RSS and caches
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
                rows, notes = ex.submit(_child, name, wl, str(workdir)).result()
            results += rows
            for r in rows:
                print(f"[{r['layout']}] {r['entries_s']:,.0f} entries/s  " + "; ".join(notes), flush=True)
            for f in workdir.glob(f"{name}*"):               # free the disk between layouts
                shutil.rmtree(f) if f.is_dir() else f.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(fmt_table(results))
    print("\nsettings:")
    for r in results:
        if "settings" in r:
            print(f"  {r['layout']}: {r['settings']}; prefill/copy {r['prefill_s']:.1f}s")
    print(f"\ntotal wall {time.perf_counter() - t_start:.0f}s, loadavg at end {os.getloadavg()[0]:.2f} "
          "(anything above ~1 means other processes competed for the 2 cores). read200 = inbox page from cursor 0 "
          f"(limit {wl.read_limit}); recent = from the last prefill pos. 'verify' must match across stores.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
