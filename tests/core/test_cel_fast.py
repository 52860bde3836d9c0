"""When the shortcut for ``a.b.c`` and ``a.b op literal`` answers itself, and when it leaves
the answer to CEL.

``test_expr_fast_path.py`` checks that the two ways agree; these tests check that the
shortcut is really taken for the values it can answer (otherwise every guard pays for the
conversion to CEL values) and declined for the values only CEL may judge (otherwise its
answer could differ from CEL's, or be no error where CEL gives one).
"""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core.cel_fast import MISS, FastForm, fast_form
from interlock.core.expr import Expression

NAMES = frozenset({"result", "inputs"})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def form(source: str) -> FastForm:
    found = fast_form(source, NAMES)
    assert found is not None, source
    return found


def test_a_path_and_a_comparison_are_read_apart() -> None:
    lookup = form(" result.a.b ")
    assert (lookup.path, lookup.op, lookup.literal) == (("result", "a", "b"), None, None)
    compare = form("result.score >= -3")
    assert (compare.path, compare.op, compare.literal) == (("result", "score"), ">=", -3)


@pytest.mark.parametrize(
    ("text", "literal"),
    [
        ("8", 8),
        ("-3", -3),
        ("2.5", 2.5),
        ("-0.5", -0.5),
        ("'a b'", "a b"),
        ('"m"', "m"),
        ("''", ""),
        ("true", True),
        ("false", False),
    ],
)
def test_each_literal_keeps_its_type(text: str, literal: Any) -> None:
    found = form(f"result.x == {text}").literal
    assert found == literal
    assert type(found) is type(literal)


def test_a_name_that_is_not_a_variable_takes_no_shortcut() -> None:
    assert fast_form("other.x", NAMES) is None
    assert fast_form("other.x == 1", NAMES) is None
    assert fast_form("other", NAMES) is None
    assert fast_form("result.x == 1", frozenset({"inputs"})) is None


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, 7, INT64_MIN, INT64_MAX, 2.5, "", "text", [], [1, "a", None], {}],
)
def test_a_plain_value_is_answered_without_cel(value: Any) -> None:
    assert form("result.x").evaluate({"result": {"x": value}}) == value
    assert form("result").evaluate({"result": value}) == value


def test_a_plain_nested_mapping_is_answered_without_cel() -> None:
    value = {"a": [1, {"b": "c"}], "d": {"e": None}}
    assert form("result").evaluate({"result": value}) == value
    assert form("result.a").evaluate({"result": value}) == [1, {"b": "c"}]


@pytest.mark.parametrize(
    "value",
    [
        INT64_MAX + 1,
        INT64_MIN - 1,
        [INT64_MAX + 1],
        ["a", [INT64_MIN - 1]],
        {"k": INT64_MAX + 1},
        {1: "a"},
        (1, 2),
        b"bytes",
        {1, 2},
    ],
)
def test_a_value_cel_converts_otherwise_is_left_to_cel(value: Any) -> None:
    """CEL converts the whole variable, even the parts the path does not reach: a value
    beyond 64 bits anywhere in it is an error there, so the shortcut must not answer."""
    assert form("result.x").evaluate({"result": {"x": value}}) is MISS
    assert form("result.y").evaluate({"result": {"x": value, "y": 1}}) is MISS


def test_a_path_that_is_not_there_is_left_to_cel() -> None:
    assert form("result.x").evaluate({"inputs": {"x": 1}}) is MISS
    assert form("result.x").evaluate({"result": {"y": 1}}) is MISS
    assert form("result.x.y").evaluate({"result": {"x": 1}}) is MISS
    assert form("result.x.y").evaluate({"result": {"x": [1]}}) is MISS


@pytest.mark.parametrize(
    ("source", "score", "expected"),
    [
        ("result.score > 7", 8, True),
        ("result.score > 7", 7, False),
        ("result.score >= 7", 7, True),
        ("result.score >= 7", 6, False),
        ("result.score < 7", 6, True),
        ("result.score < 7", 7, False),
        ("result.score <= 7", 7, True),
        ("result.score <= 7", 8, False),
        ("result.score == 7", 7, True),
        ("result.score == 7", 8, False),
        ("result.score != 7", 8, True),
        ("result.score != 7", 7, False),
        ("result.score < 2.5", 2.25, True),
        ("result.score > 2.5", 2.25, False),
        ("result.score == 'a'", "a", True),
        ("result.score < 'm'", "b", True),
        ("result.score >= 'm'", "b", False),
    ],
)
def test_a_comparison_of_one_type_is_answered_without_cel(
    source: str, score: Any, expected: bool
) -> None:
    assert form(source).evaluate({"result": {"score": score}}) is expected
    assert Expression(source).evaluate({"result": {"score": score}}) is expected


@pytest.mark.parametrize(
    ("source", "ok", "expected"),
    [
        ("result.ok == true", True, True),
        ("result.ok == true", False, False),
        ("result.ok == false", False, True),
        ("result.ok != true", False, True),
        ("result.ok != false", False, False),
    ],
)
def test_a_boolean_equality_is_answered_without_cel(source: str, ok: bool, expected: bool) -> None:
    assert form(source).evaluate({"result": {"ok": ok}}) is expected


@pytest.mark.parametrize("op", ["<", "<=", ">", ">="])
def test_ordering_booleans_is_left_to_cel(op: str) -> None:
    assert form(f"result.ok {op} true").evaluate({"result": {"ok": False}}) is MISS


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("result.x == 1", 1.0),
        ("result.x == 1.0", 1),
        ("result.x == 1", True),
        ("result.x == true", 1),
        ("result.x == 'a'", None),
        ("result.x > 1", "2"),
    ],
)
def test_a_comparison_of_two_types_is_left_to_cel(source: str, value: Any) -> None:
    assert form(source).evaluate({"result": {"x": value}}) is MISS


def test_a_comparison_on_a_value_cel_converts_otherwise_is_left_to_cel() -> None:
    activation = {"result": {"x": 1, "big": INT64_MAX + 1}}
    assert form("result.x == 1").evaluate(activation) is MISS
