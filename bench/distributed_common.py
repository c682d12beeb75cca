"""What the benches on the real engines share (bench/distributed_fanout.py,
bench/cassandra_sessions.py, bench/distributed_small_groups.py): a database, topic and
keyspace of the bench's own on the engines of $FANOUT_ENGINES_DIR/engines.env, the relay,
workers and `fanout serve` as subprocesses (both tools/deploy.py's, with the bench's
settings), a service token, and the memory of every process (/proc/<pid>/status VmHWM /
VmRSS, sampled while the bench runs). Not a bench itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import deploy  # noqa: E402

ENGINES_DIR = Path(os.environ.get("FANOUT_ENGINES_DIR", "/tmp/fanout-engines"))
SECRET = "bench-secret-bench-secret-bench-secret-0123456789"
TENANT = "bench"

# The admission gates and the backpressure limits opened wide: the benches measure the
# machinery, not the limits (as bench/serve_fanout.py does for the embedded runtime).
OPEN_GATES = {
    "FANOUT_PER_CONVERSATION_MSG_RATE": "1000000/1000000/1000000",
    "FANOUT_PER_SENDER_IN_CONVERSATION_RATE": "1000000/1s",
    "FANOUT_TENANT_FANOUT_QUOTA_CAPACITY": "1e12",
    "FANOUT_TENANT_FANOUT_QUOTA_REFILL": "1e12",
    "FANOUT_PLATFORM_FANOUT_BUDGET": "1e12",
    "FANOUT_MAX_PROJECTION_LAG_ENTRIES": "1000000000",
    "FANOUT_MAX_PROJECTION_LAG_EVENTS": "100000000",
}


def env_file() -> dict[str, str]:
    out = {}
    for line in (ENGINES_DIR / "engines.env").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


class Namespace(deploy.Namespace):
    """A PostgreSQL database, a Kafka topic (and its .pushes topic) and a Cassandra keyspace
    of one name on the engines of engines.env: created by create() (unless reused), dropped by
    drop() (a large keyspace may take minutes)."""

    def __init__(self, partitions: int, name: str | None = None, prefix: str = "bench") -> None:
        super().__init__(env_file(), partitions, name=name, prefix=prefix, keyspace_timeout=300)


def exit_on_sigterm() -> None:
    """SIGTERM (e.g. `timeout`) unwinds like an exception, so the benches' finally blocks stop
    the subprocesses and drop the namespace."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Fleet(deploy.Fleet):
    """The relay, the workers and `fanout serve` as subprocesses with the namespace's URLs
    and `settings` (the open gates), no other FANOUT_ parameter; logs in a temporary directory."""

    def __init__(self, urls: dict[str, str], settings: dict[str, str]) -> None:
        env = deploy.process_env(urls, {**settings, "FANOUT_SECRET": SECRET})
        super().__init__(env, Path(tempfile.mkdtemp(prefix="fanout-bench-")), cwd=ROOT)

    def start_pipeline(self, workers: int, relay_args: Sequence[str] = (), worker_args: Sequence[str] = ()) -> None:
        self.start("relay", "cli.relay", *relay_args)
        for i in range(workers):
            self.start(f"worker-{i + 1}", "cli.worker", *worker_args)

    def start_serve(self, data_dir: Path | None = None) -> Http:
        """`fanout serve` over `data_dir` (default: a new temporary one; the embedded runtime's
        stores when the fleet has no engine URLs), answering /healthz."""
        port = free_port()
        data = str(data_dir) if data_dir is not None else tempfile.mkdtemp(prefix="fanout-bench-serve-")
        self.start("serve", "cli.main", "serve", "--data-dir", data, "--port", str(port))
        http = Http(f"http://127.0.0.1:{port}", service_token())
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(http.base + "/healthz", timeout=1).close()
                return http
            except OSError:
                if self.procs["serve"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fanout serve did not start: see {self.logs / 'serve.log'}") from None
                time.sleep(0.1)


def service_token(sub: str = "bench") -> str:
    from fanout.security import mint_token

    return mint_token(SECRET, TENANT, "service", sub)


def user_token(user_id: str) -> str:
    from fanout.security import mint_token

    return mint_token(SECRET, TENANT, "user", user_id)


class Http:
    """JSON over HTTP to `fanout serve` (urllib, one connection per request)."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


def wait_workers(rt: Any, n: int, timeout: float = 120.0) -> float:
    """Seconds until n workers' heartbeats reach the replica `rt`."""
    t0 = time.monotonic()
    while rt.links.workers() < n:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{n} worker(s) not up within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - t0


# -- memory -----------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process in KiB ({} if it is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
    except (OSError, ValueError):
        return {}
    return out


def engine_pid(name: str) -> int | None:
    """The pid of a running engine from its pid file ($FANOUT_ENGINES_DIR/<name>/<name>.pid)."""
    try:
        pid = int((ENGINES_DIR / name / f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def until_idle(pid: int, below: float, step: float = 1.0, steps: int = 180) -> float:
    """Wait until a process uses under `below` CPU seconds in a `step` (an engine's flushes and
    compactions done), at most `steps` steps; returns its CPU seconds when the quiet step began
    (the quiet step itself not counted)."""
    last = cpu_seconds(pid)
    for _ in range(steps):
        time.sleep(step)
        now = cpu_seconds(pid)
        if now - last < below:
            break
        last = now
    return last


def pss_kib(pid: int) -> int:
    """Proportional set size (shared pages divided among their processes), 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def engine_pids(name: str) -> list[int]:
    pid = engine_pid(name)
    return [] if pid is None else [pid]


def postgres_pids() -> list[int]:
    """The postmaster and its children (backends, background workers)."""
    root = engine_pid("postgres")
    if root is None:
        return []
    import psutil

    try:
        return [root] + [c.pid for c in psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return [root]


class MemoryWatch(threading.Thread):
    """Samples VmRSS of named groups of processes every `interval` s (a group's RSS is the sum
    over its processes: PostgreSQL is a postmaster and its backends); report() adds VmHWM,
    the kernel's peak over each process's whole life."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True, name="bench-rss")
        self.interval = interval
        self.groups: dict[str, Callable[[], list[int]]] = {}
        self.peak: dict[str, int] = {}
        self.hwm: dict[str, int] = {}  # the largest VmHWM of a process of the group seen
        self.cpu_seen: dict[str, dict[int, float]] = {}  # CPU seconds per process, last sampled
        self._lock = threading.Lock()
        self.stop = threading.Event()

    def watch(self, name: str, pids: Callable[[], list[int]]) -> None:
        self.groups[name] = pids

    def sample(self) -> None:
        with self._lock:
            for name, pids in list(self.groups.items()):
                total = 0
                seen = self.cpu_seen.setdefault(name, {})
                for pid in pids():
                    st = proc_status(pid)
                    total += st.get("VmRSS", 0)
                    self.hwm[name] = max(self.hwm.get(name, 0), st.get("VmHWM", 0))
                    seen[pid] = max(seen.get(pid, 0.0), cpu_seconds(pid))
                self.peak[name] = max(self.peak.get(name, 0), total)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each group: every process of it ever sampled, a process
        that ended counted as last sampled (up to one interval short)."""
        self.sample()
        with self._lock:
            out = {name: sum(self.cpu_seen.get(name, {}).values()) for name in self.groups}
        out[MACHINE] = machine_busy_seconds()
        return out

    @staticmethod
    def cpu_report(before: dict[str, float], after: dict[str, float], wall: float) -> str:
        used = {name: after[name] - before.get(name, 0.0) for name in after}
        machine = used.pop(MACHINE, None)
        parts = [f"{name} {sec:.1f} s ({sec / wall:.2f} cores)" for name, sec in used.items() if sec >= 0.05]
        line = f"CPU used over {wall:.1f} s (this machine has {os.cpu_count()} cores): " + "; ".join(parts)
        if machine is not None:
            rest = machine - sum(used.values())
            line += (
                f"; the whole machine busy {machine / wall:.2f} cores ({rest / wall:.2f} of them outside the "
                "processes above: the kernel's own threads, anything else running)"
            )
        return line

    def report(self) -> str:
        self.sample()
        lines = [
            f"peak memory: RSS sampled every {self.interval} s while the bench ran (a group of processes: the sum "
            "of their VmRSS, shared memory counted in each); VmHWM: the kernel's peak over the process's life "
            "(the engines': since they started, before this bench; a group's: its largest process)"
        ]
        for name, pids in self.groups.items():
            pss = sum(pss_kib(pid) for pid in pids())
            lines.append(
                f"  {name:<34} peak RSS {self.peak.get(name, 0) / 1024:>7,.0f} MiB   "
                f"VmHWM {self.hwm.get(name, 0) / 1024:>7,.0f} MiB   PSS at the end {pss / 1024:>7,.0f} MiB"
            )
        return "\n".join(lines)


MACHINE = "(the whole machine)"


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat: every state but idle
    and iowait), over all its cores."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is in user)
    return busy / os.sysconf("SC_CLK_TCK")


def cassandra_writes(session: Any, keyspace: str) -> dict[str, int]:
    """Each table of `keyspace` -> the partition updates Cassandra applied to it so far
    (`system_views.local_write_latency`'s count: one a table a mutation touches; the node the
    session's query lands on only, so a single node's whole count)."""
    rows = session.execute(
        "SELECT table_name, count FROM system_views.local_write_latency WHERE keyspace_name=%s", (keyspace,)
    )
    return {
        (r["table_name"] if isinstance(r, dict) else r[0]): int(r["count"] if isinstance(r, dict) else r[1])
        for r in rows
    }


def writes_report(before: dict[str, int], after: dict[str, int], messages: int) -> str:
    """Cassandra's writes a message by table between two `cassandra_writes`, largest first."""
    moved = {t: after[t] - before.get(t, 0) for t in after if after[t] > before.get(t, 0)}
    parts = [f"{t} {n / messages:.2f}" for t, n in sorted(moved.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "Cassandra's writes a message by table (partition updates, system_views.local_write_latency): " + (
        "; ".join(parts) or "none"
    )


def watch_fleet(watch: MemoryWatch, fleet: Fleet, this_process: str | None = None) -> None:
    """The fleet's processes, this process (named `this_process`) and the three engines."""
    for name, proc in fleet.procs.items():
        watch.watch(name, partial(list, [proc.pid]))
    if this_process:
        watch.watch(this_process, partial(list, [os.getpid()]))
    for engine in ("kafka", "cassandra"):
        watch.watch(f"{engine} (JVM)", partial(engine_pids, engine))
    watch.watch("postgres (sum of all processes)", postgres_pids)
