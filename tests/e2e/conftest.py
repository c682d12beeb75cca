"""End-to-end tests: a real aiohttp server on a loopback port, driven over HTTP and
WebSocket with aiohttp's client, through a small API-client helper, on each runtime:

* `embedded`: the embedded runtime (SQLite files in a fresh data dir per test module);
* `distributed`: an API replica of the distributed runtime (tests/distributed/cluster.py),
  with `fanout relay` and `fanout worker` subprocesses, on a fresh PostgreSQL database, Kafka
  topic and Cassandra keyspace per test module on the shared engines (tests/engines.py).

The module-scoped `server` fixture is parametrized over both (ids `test_x[embedded]`,
`test_x[distributed]`). A module sets `RUNTIMES = ("embedded",)` to run on fewer, a test
`@pytest.mark.runtimes("embedded")`; say why next to it (it pokes embedded internals).
Embedded only, today: test_fresh_reads' read with no projector at all (marker); and the
tests that build their own embedded server with `serving()` / `bootstrap()` instead of
using `server` (no runtime in their ids): test_overload (a stopped runner, a RocksDB
mailbox made to fail, a connection bound needing its own PARAMS), test_operations' readyz
without a runner and server-stop tests, test_error_mapping's raising routes.
test_replicas runs distributed only (replicas).

A module sets `PARAMS = Parameters(...)` to run its server with other parameters; on the
distributed runtime they reach every process as FANOUT_<NAME> settings (`params_env`).

The distributed views lag the log by the relay and the worker: a test reads its writes with
`min_position` / `X-Fanout-Min-Position` or `eventually`, never with a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from api.app import create_app
from domain.params import Parameters, Rate
from fanout.bootstrap import bootstrap
from fanout.config import Settings, load_settings, parameter_names
from fanout.runtime import Runtime
from fanout.security import mint_token
from tests.distributed.cluster import Cluster, NamespacePool, cluster_for
from tests.engines import Keyspaces

SECRET = "e2e-secret-" + "x" * 40
RUNTIMES = ("embedded", "distributed")

# Small groups and generous rates, so only the admission tests are throttled.
FAST = dataclasses.replace(
    Parameters(),
    max_group_members=50,
    rate_small=1000,
    per_sender_in_conversation_rate=Rate(1000, 1.0),
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "runtimes(*names): run this e2e test on these runtimes only")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses the server runs once per runtime of its module (or marker)."""
    if "runtime_kind" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("runtimes")
    kinds = marker.args if marker is not None else getattr(metafunc.module, "RUNTIMES", RUNTIMES)
    unknown = set(kinds) - set(RUNTIMES)
    assert not unknown, f"{metafunc.definition.nodeid}: unknown runtimes {unknown}"
    metafunc.parametrize("runtime_kind", list(kinds), indirect=True, scope="module")


@pytest.fixture(scope="module")
def runtime_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- parameters as settings ------------------------------------------------------------


def _rate(r: Rate) -> str:
    return f"{r.count!r}/{r.per_seconds!r}s"


# Parameters field -> (FANOUT_<NAME>, how its value is written); fanout/config.py _PARAMS parses them.
_SETTINGS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "max_group_members": ("MAX_GROUP_MEMBERS", str),
    "small_max_members": ("SMALL_MAX_MEMBERS", str),
    "medium_max_members": ("MEDIUM_MAX_MEMBERS", str),
    "per_sender_in_conversation_rate": ("PER_SENDER_IN_CONVERSATION_RATE", _rate),
    "tenant_fanout_quota_capacity": ("TENANT_FANOUT_QUOTA_CAPACITY", repr),
    "tenant_fanout_quota_refill_per_sec": ("TENANT_FANOUT_QUOTA_REFILL", repr),
    "platform_fanout_budget": ("PLATFORM_FANOUT_BUDGET", repr),
    "t1_ratio": ("T1_RATIO", repr),
    "mailbox_write_budget": ("MAILBOX_WRITE_BUDGET", repr),
    "t2_ratio": ("T2_RATIO", repr),
    "capacity_window": ("CAPACITY_WINDOW", lambda v: f"{v!r}s"),
    "activity_window": ("ACTIVITY_WINDOW", lambda v: f"{v!r}s"),
    "policy_switch_exit_ratio": ("POLICY_SWITCH_EXIT_RATIO", repr),
    "policy_switch_min_interval": ("POLICY_SWITCH_MIN_INTERVAL", lambda v: f"{v!r}s"),
    "mailbox_shards": ("MAILBOX_SHARDS", str),
    "max_text_length": ("MAX_TEXT_LENGTH", str),
    "per_user_command_rate": ("PER_USER_COMMAND_RATE", _rate),
    "per_user_command_burst": ("PER_USER_COMMAND_BURST", repr),
    "fresh_read_timeout": ("FRESH_READ_TIMEOUT", lambda v: f"{v!r}s"),
    "max_projection_lag_events": ("MAX_PROJECTION_LAG_EVENTS", str),
    "max_projection_lag_entries": ("MAX_PROJECTION_LAG_ENTRIES", str),
    "max_connections": ("MAX_CONNECTIONS", str),
    "max_clock_skew": ("MAX_CLOCK_SKEW", lambda v: f"{v!r}s"),
    "rereview_hold": ("REREVIEW_HOLD", lambda v: f"{v!r}s"),
    "mailbox_unit_cost_estimate_us": ("MAILBOX_UNIT_COST_ESTIMATE_US", repr),
    "rereview_alpha_max": ("REREVIEW_ALPHA_MAX", repr),
}
_BUCKET_RATES = ("rate_small", "rate_medium", "rate_large")


def params_env(params: Parameters) -> dict[str, str]:
    """The FANOUT_<NAME> settings that make a process load `params`: one per field that
    differs from the default. A field no setting can express fails here, and the settings
    are loaded back and compared, so a module never runs with parameters it did not mean."""
    default = Parameters()
    env: dict[str, str] = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if value == getattr(default, f.name):
            continue
        if f.name in _BUCKET_RATES:
            env["FANOUT_PER_CONVERSATION_MSG_RATE"] = "/".join(repr(getattr(params, b)) for b in _BUCKET_RATES)
            continue
        if f.name not in _SETTINGS:
            raise AssertionError(
                f"Parameters.{f.name}={value!r} has no FANOUT_ setting: this module cannot run distributed"
            )
        name, write = _SETTINGS[f.name]
        env[f"FANOUT_{name}"] = write(value)
    assert set(env) <= set(parameter_names()), sorted(set(env) - set(parameter_names()))
    return env


def check_settings(env: Mapping[str, str], params: Parameters) -> None:
    """What a fanout process started with `env` loads equals `params`, or the module fails."""
    loaded = load_settings(env).params
    if loaded != params:
        diff = {
            f.name: (getattr(params, f.name), getattr(loaded, f.name))
            for f in dataclasses.fields(params)
            if getattr(params, f.name) != getattr(loaded, f.name)
        }
        raise AssertionError(f"the settings {dict(env)} load other parameters (meant, loaded): {diff}")


# -- the server ------------------------------------------------------------------


class Server:
    """The API app in its own thread and event loop, listening on 127.0.0.1:<free port>,
    over an embedded runtime or a distributed API replica (then `cluster` is its deployment)."""

    def __init__(
        self, runtime: Runtime, app: web.Application, *, kind: str = "embedded", cluster: Cluster | None = None
    ) -> None:
        self.runtime = runtime
        self.app = app
        self.kind = kind
        self.cluster = cluster
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="e2e-server", daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> Server:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the e2e server did not start")
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)

    def written(self) -> int:
        """The event log's position: unchanged means nothing was written."""
        return int(self.runtime.log_position())

    @property
    def partitions(self) -> list[int]:
        """The log partitions the projections track (the embedded log has one)."""
        return list(range(getattr(self.runtime, "partitions", 1)))


@contextlib.contextmanager
def serving(data_dir: Path, params: Parameters = FAST, *, start_runtime: bool = True) -> Iterator[Server]:
    """An embedded runtime's server over `data_dir`."""
    runtime = bootstrap(Settings.embedded(data_dir, params))
    if start_runtime:
        runtime.start()
    server = Server(runtime, create_app(runtime, SECRET)).start()
    try:
        yield server
    finally:
        server.stop()
        runtime.close()


@contextlib.contextmanager
def deployment(namespaces: NamespacePool, logs: Path, params: Parameters = FAST) -> Iterator[Cluster]:
    """A distributed deployment on a fresh namespace: its first replica (which creates the
    event store's tables), then `fanout relay` and one `fanout worker`, every process with
    `params` as FANOUT_ settings. Thrown away after: the processes SIGKILLed, the namespace
    dropped in the background."""
    urls = namespaces.take()
    try:
        cluster = cluster_for(urls, logs, **params_env(params))
        try:
            check_settings(cluster.env(), params)
            cluster.replica()
            cluster.start("relay")
            cluster.start("worker")
            cluster.wait_workers(1)
            namespaces.prefetch()  # the next module's namespace, while this one's tests run
            yield cluster
        finally:
            cluster.close(signal.SIGKILL)
    finally:
        namespaces.give_back(urls)


_distributed_modules: set[str] = set()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """How many deployments the session will build (one per module running distributed),
    after -k / -m deselection: the namespace pool prepares no more than that."""
    _distributed_modules.clear()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("runtime_kind") == "distributed":
            _distributed_modules.add(item.nodeid.split("::")[0])


@pytest.fixture(scope="session")
def namespaces(engines: dict[str, str], keyspaces: Keyspaces) -> Iterator[NamespacePool]:
    pool = NamespacePool(engines, max(1, len(_distributed_modules)), keyspaces)
    try:
        yield pool
    finally:
        pool.close()


@contextlib.contextmanager
def replica_server(cluster: Cluster) -> Iterator[Server]:
    """A server over a new API replica of `cluster` (closed with the cluster)."""
    runtime = cluster.replica()
    server = Server(runtime, create_app(runtime, SECRET), kind="distributed", cluster=cluster).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, runtime_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    params = getattr(request.module, "PARAMS", FAST)
    if runtime_kind == "embedded":
        with serving(tmp_path_factory.mktemp("data"), params) as s:
            yield s
        return
    pool = request.getfixturevalue("namespaces")
    with deployment(pool, tmp_path_factory.mktemp("cluster"), params) as cluster:
        runtime = cluster.runtimes[0]
        s = Server(runtime, create_app(runtime, SECRET), kind="distributed", cluster=cluster).start()
        try:
            yield s
        finally:
            s.stop()


# -- the client helper -------------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: Any
    headers: Mapping[str, str]

    @property
    def error(self) -> str | None:
        return self.body.get("error") if isinstance(self.body, dict) else None


def expect(reply: Reply, status: int, error: str | None = None) -> Any:
    """The reply's body, after checking its status (and error code)."""
    assert reply.status == status, f"expected {status} {error or ''}, got {reply.status}: {reply.body}"
    if error is not None:
        assert reply.error == error, reply.body
        assert set(reply.body) == {"error", "message", "details"}, reply.body
        assert isinstance(reply.body["message"], str) and isinstance(reply.body["details"], dict)
    return reply.body


async def eventually(probe: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    """Poll a read until it shows a write (views are projections: eventually consistent)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {value}"
        await asyncio.sleep(0.02)


_NO_BODY = object()


class Seen:
    """The highest log position the writes of a test answered (X-Fanout-Position), shared
    by its clients: what a read waits for to see everything the test wrote."""

    def __init__(self) -> None:
        self.position = 0

    def saw(self, headers: Mapping[str, str]) -> None:
        value = headers.get("X-Fanout-Position")
        if value is not None and value.isdigit():
            self.position = max(self.position, int(value))


class ApiClient:
    """The HTTP API as one caller (one token) sees it."""

    def __init__(self, session: aiohttp.ClientSession, base: str, token: str | None, seen: Seen | None = None) -> None:
        self.session = session
        self.base = base
        self.token = token
        self.seen = Seen() if seen is None else seen

    async def call(
        self,
        method: str,
        path: str,
        body: Any = _NO_BODY,
        *,
        data: bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        h = dict(headers or {})
        if self.token is not None:
            h.setdefault("Authorization", f"Bearer {self.token}")
        kwargs: dict[str, Any] = {"headers": h, "params": params}
        if body is not _NO_BODY:
            kwargs["json"] = body
        elif data is not None:
            kwargs["data"] = data
            h.setdefault("Content-Type", "application/json")
        async with self.session.request(method, self.base + path, **kwargs) as resp:
            text = await resp.text()
            try:
                parsed: Any = await resp.json(content_type=None) if text else None
            except ValueError:
                parsed = text
            self.seen.saw(resp.headers)
            return Reply(resp.status, parsed, resp.headers)

    # service role
    async def create_conversation(self, **body: Any) -> Reply:
        return await self.call("POST", "/v1/conversations", body)

    async def add_members(self, cid: str, user_ids: list[str]) -> Reply:
        return await self.call("POST", f"/v1/conversations/{cid}/members", {"user_ids": user_ids})

    async def remove_member(self, cid: str, uid: str) -> Reply:
        return await self.call("DELETE", f"/v1/conversations/{cid}/members/{uid}")

    async def send(self, cid: str, **body: Any) -> Reply:
        return await self.call("POST", f"/v1/conversations/{cid}/messages", body)

    async def head(self, cid: str) -> Reply:
        return await self.call("GET", f"/v1/conversations/{cid}")

    async def delivery(self, cid: str, seq: int | str) -> Reply:
        return await self.call("GET", f"/v1/conversations/{cid}/messages/{seq}/delivery")

    async def materialized(self, cid: str, seq: int, timeout: float = 10.0) -> dict[str, Any]:
        """The delivery record once materialized_at is set, read at the position of every
        write the test made (min_position), so every view holds them all when it returns:
        the distributed views write a unit's delivery records before its heads and states
        (ADR-0014), the embedded ones commit it at once."""
        deadline = time.monotonic() + timeout
        while True:
            params = {"min_position": self.seen.position} if self.seen.position else None
            reply = await self.call("GET", f"/v1/conversations/{cid}/messages/{seq}/delivery", params=params)
            if reply.status != 503:  # a fresh read that timed out: ask again until our deadline
                record = expect(reply, 200)
                if record["materialized_at"] is not None:
                    return dict(record)
            assert time.monotonic() < deadline, f"message {cid}/{seq} not materialized in {timeout} s: {reply.body}"
            await asyncio.sleep(0.02)

    # admin role
    async def open_review(self, **body: Any) -> Reply:
        return await self.call("POST", "/v1/admin/reviews", body)

    async def reviews(self) -> Reply:
        return await self.call("GET", "/v1/admin/reviews")

    async def review(self, review_id: str) -> Reply:
        return await self.call("GET", f"/v1/admin/reviews/{review_id}")

    async def decide(self, review_id: str, **body: Any) -> Reply:
        return await self.call("POST", f"/v1/admin/reviews/{review_id}/decision", body)

    async def tiers(self) -> Reply:
        return await self.call("GET", "/v1/admin/tiers")

    async def roll_back(self, size_bucket: str, reason: str = "e2e") -> Reply:
        return await self.call("POST", f"/v1/admin/tiers/{size_bucket}/rollback", {"reason": reason})

    async def capacity(self) -> Reply:
        return await self.call("GET", "/v1/admin/capacity")

    async def projections(self) -> Reply:
        return await self.call("GET", "/v1/admin/projections")

    # user role
    async def sessions(self) -> Reply:
        return await self.call("GET", "/v1/me/sessions")

    async def mailbox(self, **params: Any) -> Reply:
        return await self.call("GET", "/v1/me/mailbox", params=params)

    async def read(self, cid: str, read_seq: Any) -> Reply:
        return await self.call("POST", f"/v1/me/conversations/{cid}/read", {"read_seq": read_seq})

    async def history(self, cid: str, **params: Any) -> Reply:
        return await self.call("GET", f"/v1/me/conversations/{cid}/messages", params=params)

    async def rebuild(self, cid: str) -> Reply:
        return await self.call("POST", f"/v1/me/conversations/{cid}/rebuild")

    async def socket(self, *, auth: bool = True) -> Socket:
        ws = await self.session.ws_connect(self.base.replace("http", "ws", 1) + "/v1/ws")
        sock = Socket(ws)
        if auth:
            await sock.send(type="AUTH", token=self.token)
        return sock


class Socket:
    """A WebSocket client; frames are dicts."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, **frame: Any) -> None:
        await self.ws.send_json(frame)

    async def receive(self, timeout: float = 5.0) -> dict[str, Any]:
        msg = await self.ws.receive(timeout=timeout)
        assert msg.type is aiohttp.WSMsgType.TEXT, f"expected a frame, got {msg.type} {msg.data!r}"
        frame: dict[str, Any] = msg.json()
        return frame

    async def expect(self, frame_type: str, timeout: float = 5.0) -> dict[str, Any]:
        frame = await self.receive(timeout)
        assert frame["type"] == frame_type, frame
        return frame

    async def expect_live(
        self, frame_type: str, conversation_id: str, seq: int, timeout: float = 5.0
    ) -> dict[str, Any]:
        """The next `frame_type` frame, past live frames that repeat an earlier message of the
        conversation: a push may land after the session list already showed it (PROTOCOL.md:
        keep the highest seq), most of all on the distributed runtime, where pushes reach a
        replica by their own topic. Anything else out of place fails as in expect()."""
        while True:
            frame = await self.receive(timeout)
            shown = frame.get("conversation_seq", frame.get("latest_conversation_seq"))
            repeat = frame["type"] in ("MESSAGE", "HEAD") and frame.get("conversation_id") == conversation_id
            if repeat and isinstance(shown, int) and shown < seq:
                continue
            assert frame["type"] == frame_type, frame
            return frame

    async def session_list(self) -> list[dict[str, Any]]:
        """Every SESSION_LIST_BATCH up to the one marked last."""
        batches = []
        while True:
            batch = await self.expect("SESSION_LIST_BATCH")
            batches.append(batch)
            if batch["last"]:
                return batches

    async def closed(self, timeout: float = 5.0) -> bool:
        msg = await self.ws.receive(timeout=timeout)
        return msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)

    async def close(self) -> None:
        await self.ws.close()


class Api:
    """Hands out an ApiClient per identity: `api.service("acme")`, `api.user("acme", "ann")`."""

    def __init__(self, session: aiohttp.ClientSession, server: Server) -> None:
        self.session = session
        self.server = server
        self.seen = Seen()

    def as_token(self, token: str | None) -> ApiClient:
        return ApiClient(self.session, self.server.url, token, self.seen)

    def anonymous(self) -> ApiClient:
        return self.as_token(None)

    def service(self, tenant: str, sub: str = "billing-svc") -> ApiClient:
        return self.as_token(mint_token(SECRET, tenant, "service", sub))

    def admin(self, tenant: str, sub: str = "ops") -> ApiClient:
        return self.as_token(mint_token(SECRET, tenant, "admin", sub))

    def user(self, tenant: str, user_id: str) -> ApiClient:
        return self.as_token(mint_token(SECRET, tenant, "user", user_id))


@pytest.fixture
async def api(server: Server) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, server)


@pytest.fixture
def cid() -> str:
    """A fresh conversation id (tests in a module share one server)."""
    return f"c-{uuid.uuid4().hex[:10]}"


async def conversation(api: Api, tenant: str, cid: str, members: list[str]) -> ApiClient:
    """Create a conversation as the tenant's service; returns that service client."""
    svc = api.service(tenant)
    expect(await svc.create_conversation(conversation_id=cid, title=f"title of {cid}", members=members), 201)
    return svc


QUIET_GROUP = ["ann", *[f"quiet{i}" for i in range(9)]]


async def quiet_group_with_review_enabled(api: Api, tenant: str, cid: str) -> tuple[ApiClient, ApiClient, str]:
    """A small group where only ann is active (alpha = 1/10), then a review decided
    enable_mention_only for the tenant's small bucket with read_diffusion_min_saving 1 and
    read_diffusion_max_active_ratio 0.9 (N x (1 - alpha) = 9 > 1 and alpha < 0.9).
    Returns (service client, admin client, review id)."""
    svc = await conversation(api, tenant, cid, QUIET_GROUP)
    expect(await svc.send(cid, sender="ann", text="before"), 201)
    await svc.materialized(cid, 1)
    admin = api.admin(tenant)
    rid = expect(await admin.open_review(size_bucket="small"), 201)["review_id"]
    expect(
        await admin.decide(
            rid, decision="enable_mention_only", read_diffusion_min_saving=1.0, read_diffusion_max_active_ratio=0.9
        ),
        200,
    )
    return svc, admin, rid
