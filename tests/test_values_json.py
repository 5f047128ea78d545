"""``to_json``'s quick encoder writes what the standard encoder writes, and refuses
what it refuses, with the same message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor import _values as v
from conveyor.errors import InvalidArgument

_STANDARD = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",))),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(JSON)
def test_the_quick_encoder_writes_what_the_standard_one_writes(value: Any) -> None:
    assert v.to_json("payload", value) == _STANDARD.encode(value)


def _cycle_in_list() -> Any:
    outer: list[Any] = [1]
    outer.append({"back": outer})
    return outer


def _cycle_in_dict() -> Any:
    outer: dict[str, Any] = {}
    outer["self"] = outer
    return outer


def _deep(levels: int) -> Any:
    value: Any = None
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (_cycle_in_list(), r"must be JSON-serialisable \(Circular reference detected\)"),
        (_cycle_in_dict(), r"must be JSON-serialisable \(Circular reference detected\)"),
        (_deep(5_000), r"is nested more than 100 levels deep"),
        (_deep(101), r"is nested more than 100 levels deep"),
        ([float("nan")], r"Out of range float values are not JSON compliant"),
        ({"b": b"x"}, r"Object of type bytes is not JSON serializable"),
        ({1, 2}, r"Object of type set is not JSON serializable"),
        ({1: "x"}, r"dict keys must be strings, got int 1"),
        ("\ud800", r"must be JSON-serialisable \('utf-8' codec can't encode"),
    ],
)
def test_refusals_name_the_field_and_the_problem(value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"^payload: .*{message}") as caught:
        v.to_json("payload", value)
    assert caught.value.field == "payload"


def test_a_hundred_levels_are_accepted() -> None:
    assert v.to_json("payload", _deep(100)) == "[" * 100 + "null" + "]" * 100
