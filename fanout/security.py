"""Bearer tokens (SPEC section 6): HS256 JWTs with claims tenant, sub, role, exp.

The tenant of every request comes from its token and nowhere else (invariant I)."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from domain.errors import FanoutError
from fanout.config import ConfigError

ROLES = ("user", "service", "admin")
ALGORITHM = "HS256"
SECRET_FILE = "secret"
MAX_CLAIM_LENGTH = 128


class Unauthenticated(FanoutError):
    code = "UNAUTHENTICATED"


class Forbidden(FanoutError):
    code = "FORBIDDEN"


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
    secret: str, tenant: str, role: str, sub: str, ttl_seconds: int = 86_400, now: float | None = None
) -> str:
    _check_claims(tenant, sub, role)
    issued = int(time.time() if now is None else now)
    claims = {"tenant": tenant, "sub": sub, "role": role, "iat": issued, "exp": issued + int(ttl_seconds)}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify_token(secret: str, token: str) -> Claims:
    """The claims of a valid token; Unauthenticated for an expired, forged or malformed one."""
    if not isinstance(token, str) or not token:
        raise Unauthenticated("a bearer token is required")
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            options={"require": ["exp", "tenant", "sub", "role"]},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthenticated("the token has expired") from None
    except jwt.InvalidSignatureError:
        raise Unauthenticated("the token's signature is not valid") from None
    except jwt.InvalidTokenError as exc:
        raise Unauthenticated(f"the token is not valid: {exc}") from None
    tenant, sub, role = claims["tenant"], claims["sub"], claims["role"]
    try:
        _check_claims(tenant, sub, role)
    except ValueError as exc:
        raise Unauthenticated(f"the token is not valid: {exc}") from None
    return Claims(tenant=tenant, sub=sub, role=role, exp=int(claims["exp"]))


def _check_claims(tenant: Any, sub: Any, role: Any) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    for name, value in (("tenant", tenant), ("sub", sub)):
        if not isinstance(value, str) or not value or len(value) > MAX_CLAIM_LENGTH:
            raise ValueError(f"{name} must be a non-empty string of at most {MAX_CLAIM_LENGTH} characters")
