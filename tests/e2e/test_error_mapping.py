"""One middleware maps every domain error to its HTTP status and the one JSON shape;
checked here for the codes no public route can provoke on demand (REVIEW_REQUIRED, INTERNAL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from api.app import create_app
from api.errors import STATUS
from domain import errors
from fanout import security
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from tests.e2e.conftest import SECRET, Server

ERRORS: dict[str, type[errors.FanoutError]] = {
    cls.code: cls
    for module in (errors, security)
    for cls in vars(module).values()
    if isinstance(cls, type) and issubclass(cls, errors.FanoutError)
}


async def raise_error(request: web.Request) -> web.Response:
    code = request.match_info["code"]
    if code == "CRASH":
        raise RuntimeError("secret internals")
    raise ERRORS[code]("it failed", retry_after_ms=1500, gate="per_conversation_msg_rate")


@pytest.fixture(scope="module")
def raising_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    runtime = bootstrap(Settings.embedded(tmp_path_factory.mktemp("data"))).start()
    app = create_app(runtime, SECRET)
    app.router.add_get("/raise/{code}", raise_error)
    server = Server(runtime, app).start()
    yield server
    server.stop()
    runtime.close()


@pytest.fixture
async def get(raising_server: Server) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=raising_server.url) as session:
        yield session


def test_every_domain_error_code_has_a_status() -> None:
    assert set(ERRORS) <= set(STATUS)
    assert {"REVIEW_REQUIRED", "UNAUTHENTICATED", "FORBIDDEN", "INTERNAL"} <= set(ERRORS)


@pytest.mark.parametrize("code", sorted(ERRORS))
async def test_each_domain_error_becomes_its_status_and_the_error_shape(get: aiohttp.ClientSession, code: str) -> None:
    async with get.get(f"/raise/{code}") as resp:
        body = await resp.json()
        assert resp.status == STATUS[code]
        assert body == {
            "error": code,
            "message": "it failed",
            "details": {"retry_after_ms": 1500, "gate": "per_conversation_msg_rate"},
        }
        if code in ("RATE_LIMITED", "FANOUT_QUOTA_EXCEEDED", "UNAVAILABLE"):
            assert resp.headers["Retry-After"] == "2"
        else:
            assert "Retry-After" not in resp.headers


async def test_an_unexpected_exception_is_internal_and_leaks_nothing(get: aiohttp.ClientSession) -> None:
    async with get.get("/raise/CRASH") as resp:
        assert resp.status == 500
        body = await resp.json()
    assert body == {"error": "INTERNAL", "message": "internal error", "details": {}}


def test_the_secret_is_created_once_with_mode_0600_and_read_back(tmp_path: Path) -> None:
    first = security.load_or_create_secret(tmp_path, None)
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert security.load_or_create_secret(tmp_path, None, create=False) == first
    assert security.load_or_create_secret(tmp_path, "from-env") == "from-env"


def test_reading_a_secret_that_was_never_created_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(security.SecretMissing, match="fanout serve.*FANOUT_SECRET"):
        security.load_or_create_secret(tmp_path / "empty", None, create=False)


def test_a_minted_token_verifies_to_its_claims_and_a_bad_role_is_refused() -> None:
    token = security.mint_token(SECRET, "acme", "admin", "ops", ttl_seconds=60, now=1_000_000_000)
    with pytest.raises(security.Unauthenticated, match="expired"):
        security.verify_token(SECRET, token)
    claims = security.verify_token(SECRET, security.mint_token(SECRET, "acme", "admin", "ops"))
    assert (claims.tenant, claims.sub, claims.role) == ("acme", "ops", "admin")
    with pytest.raises(ValueError, match="role"):
        security.mint_token(SECRET, "acme", "root", "ops")
