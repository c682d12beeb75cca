"""The headline measures of docs/PERFORMANCE.md, both runtimes in one run, printed as the
doc's first table (`make bench`).

    make bench                                        # the headline set, sized for under 20 minutes on 2 cores
    .venv/bin/python bench/headline.py --quick        # a smoke run: small sizes, seconds a row; not numbers to quote
    .venv/bin/python bench/headline.py --only fanout,login --runtime distributed
    .venv/bin/python bench/headline.py --logs DIR     # keep each bench's whole output in DIR

Each measure runs an existing bench as a subprocess, one at a time (they share the cores), with
the same sizes on both runtimes and the same path (HTTP, the WebSocket, or the application
in-process, as the row says):

* fanout: a 100k-member group with 10,000,000 entries already stored, 10 sends over HTTP one
  after another, entries/s from the first send until the views hold the last; then 10 more one
  at a time, accepted -> materialized_at (bench/serve_fanout.py; bench/distributed_fanout.py
  --http --preload);
* login: a user in 5,000 conversations (a message each, last activity over 720 hours) logs in
  over the WebSocket, 20 times after a first (bench/embedded_sessions.py;
  bench/cassandra_sessions.py);
* http: 3,000 sends over HTTP from 16 keep-alive clients to 300 groups of 20, one send a request,
  then 6,000 in batches of 16 (bench/http_sends.py --runtime both);
* small: 1,000 groups of 20 members of their own, 30,000 sends in groups of 32 a transaction
  through the application in-process: the embedded runtime as fast as it goes (sends, then the
  projection), the distributed one paced at 500 messages/s for a minute with the views' lag
  sampled (bench/small_groups.py; bench/distributed_small_groups.py).

Every bench prints the durability it ran under (bench/durability.py: read from the engines and
stores) and the CPU each process used; the table takes its cells from those lines. The engines:
those of $FANOUT_ENGINES_DIR/engines.env when they answer, else started for the run and
stopped after it (infra/testcontainers/engines.py engines_in_use, as the tests do).

A bench that fails or prints an unexpected line leaves "failed" in its cells (its output kept)
and the run exits 1. Prints numbers; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT = 40 * 60  # seconds a single bench may take before it is stopped


@dataclass
class Row:
    measure: str
    path: str
    runtime: str
    stored: str
    result: str = "failed"
    cpu: str = "-"
    durability: str = "-"
    command: str = ""


@dataclass
class Run:
    """One bench invocation and the rows it fills from its output."""

    key: str  # the --only group
    runtime: str  # embedded, distributed or both (http_sends --runtime both)
    argv: list[str]
    fill: Callable[[str, list[Row]], None]
    rows: list[Row] = field(default_factory=list)


class Missing(ValueError):
    pass


def grab(pattern: str, text: str) -> re.Match[str]:
    m = re.search(pattern, text, re.MULTILINE)
    if m is None:
        raise Missing(f"no line matching {pattern!r}")
    return m


def num(text: str) -> float:
    return float(text.replace(",", ""))


def durability(text: str) -> str:
    return grab(r"^durability: (.*)$", text).group(1)


def short_name(name: str) -> str:
    name = name.replace(" (JVM)", "").replace(" (sum of all processes)", "").replace(" (process)", "")
    m = re.fullmatch(r"this process \((.*)\)", name)
    return f"{m.group(1)} (bench)" if m else name


def cpu_line(text: str, prefix: str = r"\s*") -> str:
    """`MemoryWatch.cpu_report`'s line as a cell: each process's CPU seconds over the window."""
    m = grab(prefix + r"CPU used over ([\d.]+) s \(this machine has \d+ cores\): (.*)$", text)
    body, machine = m.group(2), None
    if "; the whole machine busy" in body:
        body, rest = body.split("; the whole machine busy", 1)
        machine = rest.split()[0]
    parts = re.findall(r"(?:^|; )(.+?) ([\d.]+) s \([\d.]+ cores\)", body)
    cell = ", ".join(f"{short_name(n)} {float(s):.1f}" for n, s in parts if float(s) >= 0.1)
    return f"over {m.group(1)} s: {cell} s" + (f"; machine {machine} cores busy" if machine else "")


def cpu_total(text: str, prefix: str = r"\s*") -> float:
    """Every process's CPU seconds in that line (the whole machine's left out)."""
    body = grab(prefix + r"CPU used over [\d.]+ s \(this machine has \d+ cores\): (.*)$", text).group(1)
    body = body.split("; the whole machine busy", 1)[0]
    return sum(float(s) for s in re.findall(r"([\d.]+) s \([\d.]+ cores\)", body))


# -- the measures ---------------------------------------------------------------------------


def fill_fanout_embedded(out: str, rows: list[Row]) -> None:
    burst = grab(r"burst\s+(\d+) messages = ([\d,]+) entries materialized in ([\d.]+)s = ([\d,]+) entries/s", out)
    lat = grab(r"send accepted -> materialized_at p50 (\d+) ms, max (\d+) ms", out)
    rows[0].result = f"**{burst.group(4)} entries/s** ({burst.group(2)} entries in {burst.group(3)} s)"
    rows[0].cpu = cpu_line(out)
    rows[1].result = f"**p50 {lat.group(1)} ms**, max {lat.group(2)} ms"


def fill_fanout_distributed(out: str, rows: list[Row]) -> None:
    burst = grab(r"hold all ([\d,]+) mailbox entries ([\d.]+) s after the first send = ([\d,]+) entries/s", out)
    lat = grab(
        r"accepted -> views hold it p50 ([\d.]+) s, max ([\d.]+) s; accepted -> materialized_at p50 ([\d.]+) s, "
        r"max ([\d.]+) s",
        out,
    )
    rows[0].result = f"**{burst.group(3)} entries/s** ({burst.group(1)} entries in {burst.group(2)} s)"
    rows[0].cpu = cpu_line(out, r"^\s+")
    ms = [round(1000 * float(v)) for v in lat.groups()]
    rows[1].result = f"**p50 {ms[2]:,} ms**, max {ms[3]:,} ms (views hold it: p50 {ms[0]:,} ms)"


def fill_login(out: str, rows: list[Row]) -> None:
    first = grab(r"AUTH sent -> first batch\s+p50\s+([\d.]+) ms\s+p90\s+([\d.]+) ms", out)
    last = grab(r"AUTH sent -> last batch\s+p50\s+([\d.]+) ms\s+p90\s+([\d.]+) ms", out)
    fresh = grab(r"WebSocket \(fanout serve\)\s+.*: first batch ([\d.]+) ms, last batch ([\d.]+) ms", out)
    cpu = grab(r"CPU a login \(the warm-up's included\): (.*)$", out).group(1)
    parts = re.findall(r"(?:^|, )(.+?) ([\d.]+) ms", cpu)
    rows[0].result = (
        f"first batch **p50 {first.group(1)} ms** (p90 {first.group(2)}), whole list "
        f"**p50 {last.group(1)} ms** (p90 {last.group(2)})"
    )
    rows[0].cpu = "a login: " + ", ".join(f"{short_name(n)} {v} ms" for n, v in parts if n != "(the whole machine)")
    rows[1].result = f"first batch {fresh.group(1)} ms, whole list {fresh.group(2)} ms"


def http_section(out: str, runtime: str) -> str:
    start = out.index(f"{runtime}: fanout serve ready")
    end = out.find("fanout serve ready", start + 30)
    return out[start : end if end > 0 else len(out)]


def fill_http(out: str, rows: list[Row]) -> None:
    for row in rows:
        part = http_section(out, row.runtime)
        sends = grab(r"sends\s+([\d,]+) accepted/s \(p50 ([\d.]+) ms", part)
        e2e = grab(r"end to end\s+views hold the last send ([\d.]+) s after it was accepted: ([\d,]+) messages/s", part)
        row.result = (
            f"**{sends.group(1)} accepted/s** (p50 {sends.group(2)} ms a request); end to end {e2e.group(2)} msg/s"
        )
        row.cpu = cpu_line(part, r"\s*until held:\s+")
        row.durability = durability(part)


def fill_small_embedded(out: str, rows: list[Row]) -> None:
    sends = grab(r"command side\s+([\d,]+) sends accepted/s", out)
    proj = grab(r"projection\s+([\d,]+) messages/s", out)
    per = grab(r"CPU of the process, sends and projection: ([\d.]+) ms a message", out)
    rows[0].result = f"unpaced: **{sends.group(1)} sends/s**, then **{proj.group(1)} msg/s** projected"
    rows[0].cpu = f"one process, sends and projection: {per.group(1)} ms a message"
    rows[1].result = f"**{per.group(1)} ms**"
    rows[1].cpu = rows[0].cpu


def fill_small_distributed(out: str, rows: list[Row]) -> None:
    n = int(num(grab(r": (\d+) sends accepted through", out).group(1)))
    sends = grab(r"command side\s+([\d,]+) sends accepted/s", out)
    proj = grab(r"views hold the last send ([\d.]+) s after it was accepted: ([\d,]+) messages/s", out)
    trend = grab(
        r"lag trend: medians by quarter (.*?)(?:; second half's least-squares slope ([+\-\d,]+) events.*)?$", out
    )
    slope = f", slope over the second half {trend.group(2)} events/min" if trend.group(2) else ""
    rows[0].result = (
        f"paced at {sends.group(1)} sends/s: views **{proj.group(1)} s behind** at the end, "
        f"{proj.group(2)} msg/s end to end; lag by quarter {trend.group(1).strip()} events{slope}"
    )
    rows[0].cpu = cpu_line(out, r"^\s+")
    per_message = 1000 * cpu_total(out, r"^\s+") / n
    rows[1].result = f"**{per_message:.2f} ms** at {sends.group(1)} msg/s"
    rows[1].cpu = rows[0].cpu


def runs(quick: bool) -> list[Run]:
    """The headline set; --quick: the same benches at smoke sizes."""
    if quick:
        members, prefill, messages, latency, conversations, repeats = 5_000, 4, 3, 3, 200, 5
        groups, sends, batched, small_groups, users, small_sends, rate = 30, 300, 480, 50, 1_000, 1_000, 200
    else:
        members, prefill, messages, latency, conversations, repeats = 100_000, 100, 10, 10, 5_000, 20
        groups, sends, batched, small_groups, users, small_sends, rate = 300, 3_000, 6_000, 1_000, 20_000, 30_000, 500
    stored = members * prefill
    big = f"{members // 1000}k" if members >= 1000 else str(members)

    def argv(script: str, args: str) -> list[str]:
        return [sys.executable, f"bench/{script}", *args.split()]

    def fanout_rows(runtime: str, how: str) -> list[Row]:
        data = f"{stored:,} entries {how}"
        return [
            Row(f"fan-out, {big}-member group, {messages} sends one after another: entries/s from the first send "
                "until the views hold the last", "HTTP", runtime, data),
            Row(f"one {big}-member message, accepted -> materialized_at (p50, max of {latency})", "HTTP", runtime,
                data),
        ]  # fmt: skip

    def login_rows(runtime: str, cache: str) -> list[Row]:
        what = f"{conversations:,} conversations, a message each, last activity over 720 h"
        return [
            Row(f"login of a user in {conversations:,} conversations: AUTH -> first / last SESSION_LIST_BATCH, "
                f"p50 of {repeats} later logins", "WebSocket", runtime, f"{what}; {cache}"),
            Row("the same user's first login on a fresh `fanout serve`", "WebSocket", runtime, what),
        ]  # fmt: skip

    def http_rows(n: int, batch: int) -> list[Row]:
        per = "one send a request" if batch == 1 else f"`POST /v1/messages/batch` of {batch}"
        measure = f"sends, {per}, 16 keep-alive clients, {n:,} sends to {groups} groups of 20"
        return [Row(measure, "HTTP", runtime, "empty at the start") for runtime in ("embedded", "distributed")]

    def small_rows(runtime: str) -> list[Row]:
        measure = f"small groups: {small_groups:,} groups of 20 (members of their own), {small_sends:,} sends, 32 a transaction"
        return [
            Row(measure, "in-process", runtime, "empty at the start"),
            Row("CPU a small message, every process", "in-process", runtime, "empty at the start"),
        ]

    fanout = f"--members {members} --messages {messages} --latency-messages {latency}"
    login = f"--conversations {conversations} --repeats {repeats}"
    small = f"--groups {small_groups} --members 20 --users {users} --messages {small_sends} --group 32"
    return [
        Run("fanout", "embedded", argv("serve_fanout.py", f"{fanout} --prefill-messages {prefill}"),
            fill_fanout_embedded, fanout_rows("embedded", "(earlier messages of the group)")),
        Run("fanout", "distributed", argv("distributed_fanout.py", f"--http {fanout} --preload {stored} --no-naive"),
            fill_fanout_distributed, fanout_rows("distributed", "(other users', written first)")),
        Run("login", "embedded", argv("embedded_sessions.py", login),
            fill_login, login_rows("embedded", "SQLite, no head cache")),
        Run("login", "distributed", argv("cassandra_sessions.py", login),
            fill_login, login_rows("distributed", "later logins find the replica's head cache warm (ADR-0035)")),
        Run("http", "both", argv("http_sends.py", f"--runtime both --groups {groups} --messages {sends}"),
            fill_http, http_rows(sends, 1)),
        Run("http", "both", argv("http_sends.py", f"--runtime both --groups {groups} --messages {batched} --batch 16"),
            fill_http, http_rows(batched, 16)),
        Run("small", "embedded", argv("small_groups.py", small), fill_small_embedded, small_rows("embedded")),
        Run("small", "distributed", argv("distributed_small_groups.py", f"{small} --rate {rate}"),
            fill_small_distributed, small_rows("distributed")),
    ]  # fmt: skip


# -- running them ---------------------------------------------------------------------------


def bench_env() -> dict[str, str]:
    """This environment without the fanout settings (an embedded serve must not see engine
    URLs; each bench sets its own), the engine scripts' FANOUT_ENGINES* kept."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_") or k.startswith("FANOUT_ENGINES")}


def run_one(run: Run, log: Path) -> tuple[str, float, int]:
    """The bench's output (also written to `log`), its wall seconds and exit status; stopped
    (SIGTERM to its process group, then SIGKILL) after RUN_TIMEOUT."""
    t = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(run.argv) + "\n")
        f.flush()
        proc = subprocess.Popen(
            run.argv, cwd=ROOT, env=bench_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status = proc.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                status = proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                status = proc.wait()
    return log.read_text(), time.monotonic() - t, status


def command_cell(argv: list[str]) -> str:
    return "`" + " ".join(["python", *argv[1:]]) + "`"


def machine() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, IndexError, ValueError):
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:", 1)[1].split()[0])
        mem = f"{kib / 2**20:.0f} GiB"
    return f"{os.cpu_count()} cores ({model}), {mem}, Python {platform.python_version()}"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + ("+ (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def table(rows: list[Row], when: str) -> str:
    head = ["measure", "path", "runtime", "stored data", "durability", "result", "CPU per process", "command", "run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.measure, r.path, r.runtime, r.stored, r.durability, r.result, r.cpu, r.command, when]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


@contextlib.contextmanager
def engines(needed: bool) -> Iterator[None]:
    """The engines for the distributed runs (none asked for when only embedded rows run)."""
    if not needed:
        yield
        return
    sys.path.insert(0, str(ROOT / "infra" / "testcontainers"))
    import engines as infra_engines  # infra/testcontainers/engines.py

    sys.path.pop(0)
    with infra_engines.engines_in_use() as urls:
        print(f"engines: {urls}", flush=True)
        yield


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke sizes: proves the run end to end, not numbers")
    ap.add_argument("--only", default="", help="comma-separated: fanout, login, http, small (default: all)")
    ap.add_argument("--runtime", choices=("both", "embedded", "distributed"), default="both")
    ap.add_argument("--logs", type=Path, help="keep each bench's output here (default: a temporary directory)")
    args = ap.parse_args()

    only = {k for k in args.only.split(",") if k}
    chosen = [r for r in runs(args.quick) if (not only or r.key in only)]
    if args.runtime != "both":
        chosen = [r for r in chosen if r.runtime in (args.runtime, "both")]
        for r in chosen:
            r.rows = [row for row in r.rows if row.runtime == args.runtime]
            if r.runtime == "both":  # http_sends: that runtime alone
                r.argv[r.argv.index("both")] = args.runtime
    logs = args.logs or Path(tempfile.mkdtemp(prefix="fanout-headline-"))
    logs.mkdir(parents=True, exist_ok=True)
    when = f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {commit()}"
    print(
        f"headline{' (--quick: smoke sizes, not numbers to quote)' if args.quick else ''}: {when}; "
        f"{machine()}; logs in {logs}",
        flush=True,
    )
    failed = []
    t0 = time.monotonic()
    with engines(any(r.runtime != "embedded" for r in chosen)):
        for i, run in enumerate(chosen, 1):
            name = f"{run.key}-{run.runtime}-{i}"
            print(f"[{i}/{len(chosen)}] {' '.join(run.argv[1:])}", flush=True)
            out, took, status = run_one(run, logs / f"{name}.log")
            for row in run.rows:
                row.command = command_cell(run.argv)
            problems = [] if status == 0 else [f"exit status {status}"]
            try:  # what it printed before it failed still fills its rows
                run.fill(out, run.rows)
            except (Missing, ValueError) as exc:
                problems.append(str(exc))
            for row in run.rows:
                if row.durability == "-" and row.result != "failed":
                    with contextlib.suppress(Missing):
                        row.durability = durability(out)
            if problems:
                failed.append(f"{name}: {'; '.join(problems)} (see {logs / f'{name}.log'})")
            print(f"      {took:.0f} s{'' if status == 0 else f', exit status {status}'}", flush=True)
    rows = [row for run in chosen for row in run.rows]
    order = {m: i for i, m in enumerate(dict.fromkeys(r.measure for r in rows))}
    rows.sort(key=lambda r: order[r.measure])  # a measure's runtimes side by side
    print()
    print(
        f"Headline, {when}; {machine()}; {time.monotonic() - t0:.0f} s in all"
        + (" (--quick: smoke sizes)" if args.quick else "")
    )
    print()
    print(table(rows, when.split(" (")[0]))
    for problem in failed:
        print(f"FAILED {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
