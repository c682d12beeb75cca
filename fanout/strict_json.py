"""Strict JSON (RFC 8259 / I-JSON) in and out, in one place.

Python's `json` accepts and emits `NaN`, `Infinity` and `-Infinity` by default, and
arbitrary-size integers: neither is JSON every client can parse, and an integer beyond
64 bits overflows SQLite. So every request body and WebSocket frame is parsed by `loads`
and everything the server and the CLI emit goes through `dumps`.

`loads` refuses, naming where (a path like `details.load[2]` when it can):
* text that is not UTF-8, or not one JSON value;
* `NaN`, `Infinity`, `-Infinity` and numbers that overflow a double (`1e999`);
* integers outside the signed 64-bit range;
* strings with lone surrogates (`"\\ud800"`), which no UTF-8 store can hold;
* duplicate keys in an object (which one wins is undefined in JSON).

`dumps` never writes `NaN` or `Infinity`: a non-finite float is a ValueError naming it.
`encode` is the same promise as compact UTF-8 bytes, 3-4x faster: what the server sends
(WebSocket frames, HTTP bodies; ADR-0042)."""

from __future__ import annotations

import json
import math
from typing import Any

import pydantic_core

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class NotStrictJSON(ValueError):
    """The text is not strict JSON; `path` is where (empty for the whole text)."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    @property
    def where(self) -> str:
        return dotted(self.path)


def dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _refuse_constant(literal: str) -> Any:
    raise NotStrictJSON(f"{literal} is not a JSON number (only finite numbers are)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotStrictJSON(f"{text} is beyond the range of a double")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise NotStrictJSON(f"duplicate key {key!r} in an object")
            seen.add(key)
    return obj


def _check_text(s: str, path: tuple[str | int, ...]) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise NotStrictJSON("a string holds a lone surrogate (not valid Unicode text)", path) from None


def _check(value: Any, path: tuple[str | int, ...]) -> None:
    """Integers within 64 bits and strings of valid Unicode, everywhere in the value."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise NotStrictJSON(f"integer {value} is beyond 64 bits ({INT64_MIN} .. {INT64_MAX})", path)
    elif isinstance(value, str):
        if not value.isascii():
            _check_text(value, path)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not k.isascii():
                _check_text(k, path)
            _check(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check(v, (*path, i))


def loads(raw: bytes | str) -> Any:
    """Parse strict JSON; raises NotStrictJSON with a message for a client."""
    if isinstance(raw, bytes | bytearray):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotStrictJSON(f"the text is not UTF-8 (byte {exc.start})") from None
        if text.startswith("\ufeff"):
            text = text[1:]
    else:
        text = raw
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            object_pairs_hook=_no_duplicates,
        )
        _check(value, ())
    except NotStrictJSON:
        raise
    except json.JSONDecodeError as exc:
        raise NotStrictJSON(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits, deep nesting
        raise NotStrictJSON(f"not valid JSON: {str(exc) or type(exc).__name__}") from None
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` that refuses NaN and Infinity (ValueError naming the value)."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError as exc:
        raise ValueError(f"refusing to emit invalid JSON: {exc}") from None


def encode(value: Any) -> bytes:
    """Strict JSON of `value` as compact UTF-8 bytes: every frame and body the server sends.

    pydantic_core's serializer (Rust): a 5,000-session login list in ~7 ms against ~25 ms for
    `json.dumps` (ADR-0042). It writes a non-finite float as `NaN` / `Infinity` instead of
    refusing it, so output holding either token is encoded again by `dumps`, which refuses a
    real one (ValueError) and encodes a string that merely contains the word the slow way.
    What it cannot encode (a lone surrogate: escaped, as `dumps` does) also goes the slow way."""
    try:
        out = pydantic_core.to_json(value)
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError):
        return dumps(value, separators=(",", ":")).encode("ascii")
    if b"NaN" in out or b"Infinity" in out:
        return dumps(value, separators=(",", ":")).encode("ascii")
    return out
