"""Identity (ADR-0008): what a tenant and an id may be, and how aggregate names are
derived from them, in one place.

* A tenant is 1..64 ASCII letters, digits, '.', '_' or '-', starting with a letter or a
  digit. No '/', so it can never swallow part of the id that follows it in a name.
* An id (conversation, user, a token's sub) is 1..128 code points, none of them a control
  character (C0 or DEL: ids end keys of the mailbox store) and none a surrogate (a
  string holding one cannot be encoded as UTF-8, so it could never be stored). '/' and
  any other Unicode is allowed; ids are compared code point by code point.
* An aggregate name is `kind/tenant[/id]`. Since a valid tenant has no '/', the first '/'
  after the kind ends the tenant: the name is unambiguous, and the derivation refuses a
  tenant outside the alphabet instead of deriving a name from it."""

from __future__ import annotations

import re
from typing import Any

from domain.errors import InvalidArgument

MAX_TENANT_LENGTH = 64
TENANT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
MAX_ID_LENGTH = 128

_TENANT = re.compile(TENANT_PATTERN)
_NOT_IN_ID = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def check_tenant(value: Any, what: str = "tenant") -> str:
    """The tenant, or InvalidArgument. The message never repeats the value (it may not
    even be printable or encodable)."""
    if not isinstance(value, str) or _TENANT.fullmatch(value) is None:
        raise InvalidArgument(
            f"{what} must be 1 to {MAX_TENANT_LENGTH} ASCII letters, digits, '.', '_' or '-', "
            "starting with a letter or a digit",
            field=what,
        )
    return value


def check_id(value: Any, what: str) -> str:
    """The id, or InvalidArgument (without repeating the value)."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH or _NOT_IN_ID.search(value):
        raise InvalidArgument(
            f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters without control characters or surrogates",
            field=what,
        )
    return value


def scoped_name(kind: str, tenant: str, key: str | None = None) -> str:
    """`kind/tenant` or `kind/tenant/key`: the name an aggregate id is derived from.

    Injective in (tenant, key) because the tenant is checked to have no '/'; for every
    valid tenant it is the same string as before ADR-0008, so existing data dirs keep
    their aggregate ids."""
    name = f"{kind}/{check_tenant(tenant)}"
    return name if key is None else f"{name}/{key}"
