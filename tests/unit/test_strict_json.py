"""fanout.strict_json (hostile input never a 500) and the domain's own refusal of non-finite review parameters."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import InvalidArgument
from domain.review import Review
from fanout import strict_json
from fanout.strict_json import INT64_MAX, INT64_MIN, NotStrictJSON


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"NaN", ""),
        (b'{"a": Infinity}', ""),
        (b'{"a": [1, -Infinity]}', ""),
        (b'{"a": 1e999}', ""),
        (b'{"a": {"b": [0, 9223372036854775808]}}', "a.b[1]"),
        (b'{"a": -9223372036854775809}', "a"),
        (b'{"s": "\\ud800"}', "s"),
        (b'{"\\udfff": 1}', ""),
        (b'{"a": 1, "a": 2}', ""),
        (b"\xff\xfe{}", ""),
        (b'{"a": 1} x', ""),
        (b"", ""),
        (b"[" * 50_000 + b"]" * 50_000, ""),
        (b"1" * 5000, ""),
    ],
)
def test_loads_refuses_what_is_not_strict_json(raw: bytes, where: str) -> None:
    with pytest.raises(NotStrictJSON) as caught:
        strict_json.loads(raw)
    assert caught.value.where == where
    assert "\n" not in str(caught.value)


def test_loads_takes_the_64_bit_edges_and_finite_floats() -> None:
    value = strict_json.loads(
        b'{"max": 9223372036854775807, "min": -9223372036854775808, "f": 1.5e308, "t": "\\u00e9"}'
    )
    assert value == {"max": INT64_MAX, "min": INT64_MIN, "f": 1.5e308, "t": "é"}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_dumps_refuses_non_finite_numbers(bad: float) -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        strict_json.dumps({"deep": [1, {"x": bad}]})


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_what_dumps_writes_loads_reads_back(value: Any) -> None:
    assert strict_json.loads(strict_json.dumps(value)) == value
    assert strict_json.loads(strict_json.dumps(value, ensure_ascii=False).encode("utf-8")) == value
    assert json.loads(strict_json.dumps(value)) == value


def open_review() -> Review:
    return Review(tenant="acme", size_bucket="small", trigger="manual", details={}, opened_by="ops", at=0.0)


@pytest.mark.parametrize(
    ("min_saving", "max_active_ratio", "field"),
    [
        (math.inf, 0.5, "read_diffusion_min_saving"),
        (math.nan, 0.5, "read_diffusion_min_saving"),
        (-math.inf, 0.5, "read_diffusion_min_saving"),
        (10.0, math.nan, "read_diffusion_max_active_ratio"),
        (10.0, math.inf, "read_diffusion_max_active_ratio"),
        (True, 0.5, "read_diffusion_min_saving"),
    ],
)
def test_a_review_refuses_non_finite_decision_parameters(min_saving: Any, max_active_ratio: Any, field: str) -> None:
    review = open_review()
    with pytest.raises(InvalidArgument) as caught:
        review.decide("enable_mention_only", "ops", 1.0, min_saving, max_active_ratio)
    assert caught.value.details["field"] == field
    assert review.status == "open"


def test_a_review_takes_finite_decision_parameters() -> None:
    review = open_review()
    review.decide("enable_mention_only", "ops", 1.0, 20_000, 0.05)
    assert review.decision_params == {"read_diffusion_min_saving": 20000.0, "read_diffusion_max_active_ratio": 0.05}


# encode (ADR-0042): the server's fast path must say exactly what dumps says, and refuse what
# it refuses, whatever the value: non-finite floats anywhere, strings that merely contain the
# words NaN / Infinity (the fast path's tell), lone surrogates, non-ASCII text.
tricky_text = st.lists(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "a", "é", "\u2028", '"', "\\", "\ud800", "\x00"]), max_size=5
).map("".join)
any_values = st.recursive(
    st.none() | st.booleans() | st.integers(INT64_MIN, INT64_MAX) | st.floats() | st.text() | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6) | tricky_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(any_values)
def test_encode_says_what_dumps_says_and_refuses_what_it_refuses(value: Any) -> None:
    try:
        expected = strict_json.dumps(value)
    except ValueError:
        with pytest.raises(ValueError, match="invalid JSON"):
            strict_json.encode(value)
        return
    data = strict_json.encode(value)
    data.decode("utf-8")  # always valid UTF-8 (a lone surrogate escaped, as dumps does)
    assert json.loads(data) == json.loads(expected)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_encode_refuses_non_finite_numbers_beside_their_names(bad: float) -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        strict_json.encode({"preview": "NaN and Infinity", "deep": [1, {"x": bad}]})


def test_encode_writes_compact_utf8() -> None:
    assert strict_json.encode({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'.encode()
