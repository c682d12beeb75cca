"""Bearer tokens (SPEC section 6): HS256 JWTs with claims tenant, sub, role, exp.

The tenant of every request comes from its token and nowhere else (invariant I). A token
is valid only when its claims are: the tenant in the tenant alphabet, the sub a valid id
(ADR-0008), the role known, and exp (iat, nbf when present) an integer time. A validly
signed token with anything else is UNAUTHENTICATED, never acted on, never a 500."""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from domain.errors import FanoutError, InvalidArgument
from domain.identity import check_id, check_tenant
from fanout.config import ConfigError

ROLES = ("user", "service", "admin")
ALGORITHM = "HS256"
SECRET_FILE = "secret"
MAX_TOKEN_LENGTH = 8192  # our tokens are a few hundred characters
MAX_TIME = 253_402_300_799  # 9999-12-31T23:59:59Z: the largest exp / iat / nbf a token may carry
TIME_CLAIMS = ("exp", "iat", "nbf")


class Unauthenticated(FanoutError):
    code = "UNAUTHENTICATED"


class Forbidden(FanoutError):
    code = "FORBIDDEN"


class InvalidClaim(InvalidArgument, ValueError):
    """`mint_token` refuses a claim (a ValueError too, for callers that expect one)."""


class SecretMissing(ConfigError):
    """`fanout token` found no secret: nothing has created one yet."""


@dataclass(frozen=True)
class Claims:
    tenant: str
    sub: str
    role: str
    exp: int


def load_or_create_secret(data_dir: Path, env_secret: str | None, create: bool = True) -> str:
    """FANOUT_SECRET when set; otherwise `data_dir/secret`, created (mode 0600) on first use
    so a new user needs no set-up (SPEC section 8)."""
    if env_secret is not None:
        if not env_secret.strip():
            raise ConfigError("FANOUT_SECRET is set but empty")
        return env_secret
    path = Path(data_dir) / SECRET_FILE
    try:
        return _read_secret(path)
    except FileNotFoundError:
        if not create:
            raise SecretMissing(
                f"no token secret in {path}: run `fanout serve --data-dir {data_dir}` once to create it, "
                "or set FANOUT_SECRET"
            ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it between our read and open
        return _read_secret(path)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(48))
    return _read_secret(path)


def _read_secret(path: Path) -> str:
    value = path.read_text().strip()
    if not value:
        raise ConfigError(f"{path} is empty; delete it to have a new secret created, or set FANOUT_SECRET")
    return value


def mint_token(
    secret: str, tenant: str, role: str, sub: str, ttl_seconds: float = 86_400, now: float | None = None
) -> str:
    """A signed token; InvalidClaim for a tenant, sub, role or ttl that no server would accept."""
    try:
        _check_claims(tenant, sub, role)
    except InvalidArgument as exc:
        raise InvalidClaim(exc.message, **exc.details) from None
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float) or not math.isfinite(ttl_seconds):
        raise InvalidClaim("ttl must be a finite number of seconds", field="ttl")
    issued = int(time.time() if now is None else now)
    exp = issued + int(ttl_seconds)
    if not 0 <= issued <= exp <= MAX_TIME:
        raise InvalidClaim("the token would expire before it is issued or after the year 9999", field="ttl")
    claims = {"tenant": tenant, "sub": sub, "role": role, "iat": issued, "exp": exp}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify_token(secret: str, token: str, now: float | None = None) -> Claims:
    """The claims of a valid token; Unauthenticated for an expired, forged or malformed one.
    Messages never repeat what the token holds."""
    return _verify(secret, token, time.time() if now is None else now)[0]


def _verify(secret: str, token: str, current: float) -> tuple[Claims, int]:
    """verify_token at `current`, and the time before which the token is not valid (its nbf
    or iat, the later; 0 without either)."""
    if not isinstance(token, str) or not token:
        raise Unauthenticated("a bearer token is required")
    if not token.isascii() or len(token) > MAX_TOKEN_LENGTH:
        raise Unauthenticated(f"the token is not valid: it must be at most {MAX_TOKEN_LENGTH} ASCII characters")
    try:
        # Times are checked below, strictly: PyJWT would take "123", 1e300 or true for exp.
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            options={
                "require": ["exp", "tenant", "sub", "role"],
                "verify_exp": False,
                "verify_iat": False,
                "verify_nbf": False,
            },
        )
    except jwt.InvalidSignatureError:
        raise Unauthenticated("the token's signature is not valid") from None
    except jwt.InvalidTokenError as exc:
        raise Unauthenticated(f"the token is not valid: {exc}") from None
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise Unauthenticated("the token is not valid: it cannot be decoded") from None
    for name in TIME_CLAIMS:
        value = claims.get(name)
        if name in claims and (type(value) is not int or not 0 <= value <= MAX_TIME):
            raise Unauthenticated(f"the token is not valid: {name} must be an integer time (seconds since the epoch)")
    not_before = max(claims.get("nbf", 0), claims.get("iat", 0))
    _check_times(claims["exp"], not_before, current)
    tenant, sub, role = claims["tenant"], claims["sub"], claims["role"]
    try:
        _check_claims(tenant, sub, role)
    except InvalidArgument as exc:
        raise Unauthenticated(f"the token is not valid: its {exc.message}") from None
    return Claims(tenant=tenant, sub=sub, role=role, exp=claims["exp"]), not_before


def _check_times(exp: int, not_before: int, current: float) -> None:
    if exp <= current:
        raise Unauthenticated("the token has expired")
    if not_before > current:
        raise Unauthenticated("the token is not valid yet")


class TokenVerifier:
    """verify_token under one secret, remembering the tokens it has verified: a service
    sends the same token with every request, and checking its signature and claims again
    is most of what an authenticated request costs the event loop besides aiohttp itself
    (ADR-0024). A remembered token is still refused once expired (or before its nbf / iat,
    should the clock step back): only the signature and claim checks, which cannot change
    for the same string under the same secret, are skipped. Only valid tokens are kept, so
    the cache holds nothing a caller without the secret can add; at most `max_tokens`, the
    oldest dropped first."""

    def __init__(self, secret: str, max_tokens: int = 4096, clock: Callable[[], float] = time.time) -> None:
        self.secret = secret
        self.max_tokens = max_tokens
        self.clock = clock
        self._verified: dict[str, tuple[Claims, int]] = {}

    def __call__(self, token: str) -> Claims:
        current = self.clock()
        known = self._verified.get(token) if isinstance(token, str) else None
        if known is not None:
            claims, not_before = known
            if claims.exp <= current:
                self._verified.pop(token, None)
            _check_times(claims.exp, not_before, current)
            return claims
        claims, not_before = _verify(self.secret, token, current)
        if len(self._verified) >= self.max_tokens:
            with suppress(StopIteration, KeyError, RuntimeError):  # emptied or changed meanwhile (another thread)
                del self._verified[next(iter(self._verified))]
        self._verified[token] = (claims, not_before)
        return claims


def _check_claims(tenant: Any, sub: Any, role: Any) -> None:
    """InvalidArgument naming the first bad claim (never repeating its value)."""
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidArgument(f"role must be one of {', '.join(ROLES)}", field="role")
    check_tenant(tenant, "tenant")
    check_id(sub, "sub")
