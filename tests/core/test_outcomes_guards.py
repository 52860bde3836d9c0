"""gate-outcome-impossible over the guards a manifest author writes: each operator and kind
of value against what an output schema pins (enum, const, integer and number bounds), with
values exactly at a bound. A guard is refused, at its place in the file and with the values
the schema allows, only when no allowed answer can make it hold."""

from __future__ import annotations

import json
from typing import Any

import pytest

from interlock.core.compiler import compile_sources
from interlock.core.diagnostics import Diagnostic

WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: gate}
spec:
  initial_state: check
  states:
    check:
      actions: [{capability: judge}]
      on:
        - {event: task.completed, guard: %s, goto: done}
        - {event: task.completed, goto: done}
    done: {type: terminal}
---
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: judge}
spec:
  capabilities:
    - name: judge
      output_schema: %s
"""

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "outcome": {"enum": ["passed", "failed-tests", 'say "hi"', "b"]},
        "verdict": {"const": "checked"},
        "flag": {"const": True},
        "switch": {"enum": [True, False]},
        "level": {"enum": [1, 2, 3]},
        "half": {"const": 2.5},
        "none": {"const": None},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "temp": {"type": "number", "minimum": -5.5, "exclusiveMaximum": 40},
        "floor": {"type": "integer", "exclusiveMinimum": 3},
        "ceiling": {"type": "number", "maximum": 7},
        "notes": {"type": "string"},
        "count": {"type": "integer"},
    },
}

ALLOWS = {
    "outcome": '"passed", "failed-tests", "say \\"hi\\"", "b"',
    "verdict": '"checked"',
    "flag": "true",
    "switch": "true, false",
    "level": "1, 2, 3",
    "half": "2.5",
    "none": "null",
    "score": ">= 0 and <= 10",
    "ratio": "> 0 and < 1",
    "temp": ">= -5.5 and < 40",
    "floor": "> 3",
    "ceiling": "<= 7",
}


def _diagnostics(guard: str, schema: Any = None) -> list[Diagnostic]:
    text = WORKFLOW % (json.dumps(guard), json.dumps(SCHEMA if schema is None else schema))
    return compile_sources([("gate.yaml", text)]).diagnostics


def _refused(guard: str, schema: Any = None) -> list[Diagnostic]:
    """The rule's refusals alone (a guard CEL cannot compile, or a schema that is not valid,
    is reported by its own rule too)."""
    return [d for d in _diagnostics(guard, schema) if d.rule == "gate-outcome-impossible"]


def _refusal(guard: str, fields: list[str], allows: dict[str, str] | None = None) -> str:
    shown = "; ".join(f"result.{f}: {(allows or ALLOWS)[f]}" for f in fields)
    return (
        f"gate.yaml:10:42: gate-outcome-impossible: transition 0 of state 'check' waits for "
        f"{guard}, which no answer of capability 'judge' can satisfy (its output schema "
        f"allows {shown})"
    )


REFUSED: list[tuple[str, list[str]]] = [
    # == and != on strings, either side
    ('result.outcome == "failed"', ["outcome"]),
    ('"failed" == result.outcome', ["outcome"]),
    ('result.outcome == "Passed"', ["outcome"]),
    ('result.outcome == ""', ["outcome"]),
    ('result.verdict != "checked"', ["verdict"]),
    ('"checked" != result.verdict', ["verdict"]),
    ("result.outcome == 'say \\\"hi\\\" '", ["outcome"]),
    ('result.outcome == "\\x41"', ["outcome"]),
    ('result.outcome == "pa\\u0073sed!"', ["outcome"]),
    ('result.outcome == "passed\\n"', ["outcome"]),
    ('result.outcome == "\\110"', ["outcome"]),
    ('result.outcome == "\\U00000041"', ["outcome"]),
    # strings ordered as CEL orders them
    ('result.outcome < "b"', ["outcome"]),
    ('result.verdict < "checked"', ["verdict"]),
    ('result.verdict > "checked"', ["verdict"]),
    ('result.verdict >= "d"', ["verdict"]),
    ('result.verdict <= "check"', ["verdict"]),
    ('"checked" < result.verdict', ["verdict"]),
    ('"checked" > result.verdict', ["verdict"]),
    ('"d" <= result.verdict', ["verdict"]),
    ('"c" >= result.verdict', ["verdict"]),
    # in [...]
    ('result.outcome in ["failed", "error"]', ["outcome"]),
    ("result.outcome in []", ["outcome"]),
    ("result.level in [4, 5.5, true]", ["level"]),
    ('result.verdict in ["checked", "x"] && result.outcome in ["x"]', ["outcome", "verdict"]),
    ('["failed"] == result.outcome', ["outcome"]),
    # booleans and null are their own kinds
    ("result.flag == false", ["flag"]),
    ("result.flag != true", ["flag"]),
    ("result.flag == 1", ["flag"]),
    ('result.flag == "true"', ["flag"]),
    ("result.flag == null", ["flag"]),
    ("result.flag in [1, 0, null]", ["flag"]),
    ("result.switch == null", ["switch"]),
    ("result.switch == true && result.switch == false", ["switch"]),
    ("result.none != null", ["none"]),
    ("result.none == false", ["none"]),
    ("result.none == 0", ["none"]),
    # numbers from an enum or a const: integers and doubles compare as numbers
    ("result.level == 4", ["level"]),
    ("result.level == 0", ["level"]),
    ("result.level == 1.5", ["level"]),
    ('result.level == "1"', ["level"]),
    ("result.level == true", ["level"]),
    ("result.level > 3", ["level"]),
    ("result.level >= 3.5", ["level"]),
    ("result.level < 1", ["level"]),
    ("result.level <= 0.5", ["level"]),
    ("3 < result.level", ["level"]),
    ("1 > result.level", ["level"]),
    ("0 >= result.level", ["level"]),
    ("4 <= result.level", ["level"]),
    ("result.level > -1 && result.level < 0", ["level"]),
    ("result.half == 2", ["half"]),
    ("result.half != 2.5", ["half"]),
    ("result.half != 25e-1", ["half"]),
    ("result.half > 2.5", ["half"]),
    ("result.half < 2.5", ["half"]),
    # integer bounds, at and past them
    ("result.score > 10", ["score"]),
    ("result.score >= 11", ["score"]),
    ("result.score >= 10.5", ["score"]),
    ("result.score < 0", ["score"]),
    ("result.score <= -1", ["score"]),
    ("result.score == 11", ["score"]),
    ("result.score == -1", ["score"]),
    ("result.score == 10.5", ["score"]),
    ("10 < result.score", ["score"]),
    ("0 > result.score", ["score"]),
    ("11 <= result.score", ["score"]),
    ("-1 >= result.score", ["score"]),
    ("result.score > 10 || result.score < 0", ["score"]),
    # exclusive bounds refuse the bound itself; inclusive ones do not
    ("result.ratio >= 1", ["ratio"]),
    ("result.ratio >= 1.0", ["ratio"]),
    ("result.ratio > 1", ["ratio"]),
    ("result.ratio <= 0", ["ratio"]),
    ("result.ratio < 0", ["ratio"]),
    ("result.ratio == 1", ["ratio"]),
    ("result.ratio == 0", ["ratio"]),
    ("result.ratio == -0.5", ["ratio"]),
    ("result.ratio == 1.5", ["ratio"]),
    ("result.temp >= 40", ["temp"]),
    ("result.temp == 40", ["temp"]),
    ("result.temp < -5.5", ["temp"]),
    ("result.temp == -6", ["temp"]),
    ("result.floor <= 3", ["floor"]),
    ("result.floor == 3", ["floor"]),
    ("result.floor < 2", ["floor"]),
    ("result.ceiling > 7", ["ceiling"]),
    ("result.ceiling == 7.5", ["ceiling"]),
    # && || ! and parentheses
    ('result.outcome == "failed" && result.notes == "x"', ["outcome"]),
    ('result.notes == "x" && result.outcome == "failed"', ["outcome"]),
    ('result.outcome == "failed" || result.verdict == "unchecked"', ["outcome", "verdict"]),
    (
        'result.outcome != "passed" && result.outcome != "failed-tests"'
        ' && result.outcome != "say \\"hi\\"" && result.outcome != "b"',
        ["outcome"],
    ),
    ('!(result.verdict == "checked")', ["verdict"]),
    ('!(result.verdict != "x")', ["verdict"]),
    ('!!(result.verdict == "x")', ["verdict"]),
    ('!(!(result.verdict == "x"))', ["verdict"]),
    ('!(result.verdict == "checked" && result.flag == true)', ["flag", "verdict"]),
    ('!(result.outcome != "x" || result.notes == "y")', ["outcome"]),
    ("!(result.flag == true)", ["flag"]),
    (
        '(result.outcome == "passed" && result.verdict == "x") || result.level == 9',
        ["level", "outcome", "verdict"],
    ),
    (
        'result.outcome == "passed" && (result.verdict == "x" || result.flag == false)',
        ["flag", "outcome", "verdict"],
    ),
    ("result.score > 10 && result.count > 1", ["score"]),
    ("result.score > 10 || result.ratio >= 1", ["ratio", "score"]),
    ('result.score == 5 && result.outcome == "x"', ["outcome", "score"]),
    ("result.level == 2 && result.switch == true && result.half == 3", ["half", "level", "switch"]),
    ("  result.level == 9  ", ["level"]),
    ("result.level==9", ["level"]),
    ("(result.level == 9)", ["level"]),
    ("((result.level == 9))", ["level"]),
]


@pytest.mark.parametrize(("guard", "fields"), REFUSED)
def test_a_guard_no_allowed_answer_satisfies_is_refused_where_it_stands(
    guard: str, fields: list[str]
) -> None:
    assert [str(d) for d in _diagnostics(guard)] == [_refusal(guard, fields)]


ACCEPTED = [
    # a value the schema allows
    'result.outcome == "passed"',
    'result.outcome == "b"',
    '"failed-tests" == result.outcome',
    "result.outcome == 'say \"hi\"'",
    'result.outcome == "say \\"hi\\""',
    'result.outcome == "\\x62"',
    'result.outcome == "\\u0062"',
    'result.outcome == "\\142"',
    'result.outcome != "failed"',
    'result.outcome != "passed"',
    'result.verdict == "checked"',
    'result.verdict != "x"',
    # string order: "checked" lies between
    'result.verdict < "d"',
    'result.verdict <= "checked"',
    'result.verdict > "c"',
    'result.verdict >= "checked"',
    '"checked" <= result.verdict',
    '"checked" >= result.verdict',
    '"c" < result.verdict',
    '"d" > result.verdict',
    'result.outcome <= "b"',
    # in [...]
    'result.outcome in ["failed", "passed"]',
    'result.outcome in ["b"]',
    "result.level in [3]",
    "result.level in [2.0]",
    'result.outcome in "passed"',  # not a list: not judged
    'result.verdict in ["checked", "x"] && result.outcome in ["b", "x"]',
    # booleans and null
    "result.flag == true",
    "result.flag != false",
    "result.flag in [true]",
    "result.switch == false",
    "result.switch != true",
    "result.none == null",
    "result.none != false",
    'result.flag != "true"',
    # numbers: equal across int and double, ordered
    "result.level == 1",
    "result.level == 3.0",
    "result.level != 1",
    "result.level >= 3",
    "result.level > 2.5",
    "result.level <= 1",
    "result.level < 1.5",
    "3 <= result.level",
    "1 >= result.level",
    "2 < result.level",
    "2 > result.level",
    "result.half == 2.5",
    "result.half == 25e-1",
    "result.half >= 2.5",
    "result.half <= 2.5",
    "result.level < true",  # a number ordered against a boolean: not judged
    'result.level > "1"',
    "result.flag < true",
    # bounds: exactly at an inclusive bound may hold
    "result.score >= 10",
    "result.score == 10",
    "result.score <= 0",
    "result.score == 0",
    "result.score > 9",
    "result.score < 1",
    "result.score > 9.5",
    "result.score != 11",
    "10 <= result.score",
    "0 >= result.score",
    "result.score in [11]",  # in against a range: not judged
    'result.score == "high"',
    "result.score == null",
    "result.ratio < 1",
    "result.ratio > 0",
    "result.ratio == 0.5",
    "result.ratio >= 0.999",
    "result.ratio <= 0.001",
    "result.temp >= 39.9",
    "result.temp <= -5.5",
    "result.temp == -5.5",
    "result.temp > -5.5",
    "result.floor > 3",
    "result.floor >= 3",
    "result.floor == 4",
    "result.floor < 3.5",
    "result.floor > 1000",
    "result.ceiling == 7",
    "result.ceiling >= 7",
    "result.ceiling < -1000",
    "result.count > 1000000",
    "result.count < -1000000",
    # && || ! and parentheses
    'result.outcome == "failed" || result.outcome == "passed"',
    'result.outcome == "failed" || result.notes == "x"',
    'result.notes == "x" || result.outcome == "failed"',
    'result.outcome != "passed" && result.verdict == "checked"',
    '!(result.outcome == "failed")',
    '!(result.outcome == "passed")',
    '!!(result.outcome == "passed")',
    '!(result.verdict == "x" && result.outcome == "passed")',
    '!(result.verdict == "checked" && result.notes == "x")',
    '!!(result.notes == "x") || result.level == 9',
    "!(result.score > 10)",
    "!(result.ratio >= 1)",
    "result.score > 10 || result.count > 1",
    'result.score == 5 || result.outcome == "x"',
    "result.score > 5 && result.score < 3",  # two bounds of one number: not weighed
    "result.level == 2 && result.switch == true && result.half == 2.5",
    # what is not read may hold
    'result.outcome == "failed" || inputs.force',
    'result.outcome == "failed" || true',
    "result.level == 9 || result.level",
    'size(result.notes) > 0 && result.outcome == "failed"',
    "result.level == result.half",
    "9 == 9 && result.level == 9",
    "result.level + 1 == 9",
    "result.level == 9 ||",
    "result.level == 9 && (result.level == 8",
    "result.level ==",
    "result.level == 1u",
    "result.level == 0x9",
    "result.level == 09",
    "result.level == -9 - 1",
    "result.level == 9 result.level == 8",
    "result.level == [9, result.half]",
    "[9] in result.level",
    'result.outcome == r"failed"',
    'result.outcome == b"failed"',
    'result.outcome == "fa\\?iled"',
    'result.outcome == "\\q"',
    'result.outcome == "\\u00"',
    'result.outcome == "é\\n"',
    'result.outcome.startsWith("x")',
    "result.outcomes == 9",  # not in the schema
    "result.level == truest",
    "result.level == [[9]]",
    "(result.level == 9]",
    "result.level == (9]",
    "result.level && result.flag == false",
    'result.flag || true && result.outcome == "x"',  # result.flag || (true && ...): holds
    "result.level result.flag == false",
    "result.level == 9 == true",
    "!result.level == 9",
    "!result.flag != null",  # (!true) != null: holds
    "!result.flag in [true, false]",  # (!true) in [...]: holds
    "!result.switch == result.flag",
]


@pytest.mark.parametrize("guard", ACCEPTED)
def test_a_guard_an_allowed_answer_may_satisfy_is_accepted(guard: str) -> None:
    assert _refused(guard) == []


def test_a_non_ascii_value_is_compared_as_written() -> None:
    schema = {"properties": {"outcome": {"enum": ["é"]}}}
    assert _diagnostics('result.outcome == "é"', schema) == []
    assert [d.rule for d in _diagnostics('result.outcome == "e"', schema)] == [
        "gate-outcome-impossible"
    ]


@pytest.mark.parametrize(
    ("prop", "allows"),
    [
        ({"type": "integer", "maximum": 1234567}, "<= 1234567"),
        ({"type": "number", "exclusiveMaximum": 0.1}, "< 0.1"),
        ({"type": "number", "maximum": 0.25}, "<= 0.25"),
        ({"type": "integer", "maximum": 10, "minimum": 10}, ">= 10 and <= 10"),
    ],
)
def test_a_bound_is_shown_as_the_schema_wrote_it(prop: dict[str, Any], allows: str) -> None:
    schema = {"properties": {"n": prop}}
    assert [str(d) for d in _diagnostics("result.n > 1234567", schema)] == [
        _refusal("result.n > 1234567", ["n"], {"n": allows})
    ]


@pytest.mark.parametrize(
    ("prop", "guard"),
    [
        # exclusive bounds override inclusive ones, either side
        ({"type": "number", "minimum": 0, "exclusiveMinimum": 0}, "result.n <= 0"),
        ({"type": "number", "maximum": 5, "exclusiveMaximum": 5}, "result.n >= 5"),
        ({"type": "integer", "minimum": 1}, "result.n < 1"),
        ({"type": "integer", "maximum": 1}, "result.n > 1"),
        ({"const": 3, "type": "integer", "maximum": 100}, "result.n == 4"),
        ({"enum": [3, 4], "type": "integer", "minimum": 0}, "result.n == 0"),
    ],
)
def test_what_pins_a_number(prop: dict[str, Any], guard: str) -> None:
    assert [d.rule for d in _diagnostics(guard, {"properties": {"n": prop}})] == [
        "gate-outcome-impossible"
    ]


@pytest.mark.parametrize(
    ("schema", "guard"),
    [
        ({"properties": {"n": {"type": "string", "maximum": 1}}}, "result.n > 1"),
        ({"properties": {"n": {"maximum": 1}}}, "result.n > 1"),
        ({"properties": {"n": {"type": "integer"}}}, "result.n > 1"),
        ({"properties": {"n": {"type": "integer", "maximum": True}}}, "result.n > 1"),
        ({"properties": {"n": {"type": "integer", "exclusiveMaximum": True}}}, "result.n > 1"),
        ({"properties": {"n": {"type": "number", "maximum": "1"}}}, "result.n > 1"),
        ({"properties": {"n": {"enum": "ab"}}}, 'result.n == "c"'),
        ({"properties": {"n": 5, "m": {"const": 1}}}, "result.n == 2 || result.m == 1"),
        ({"properties": [{"n": {"const": 1}}]}, "result.n == 2"),
        ({"type": "object"}, "result.n == 2"),
        # draft-4 boolean exclusiveMaximum: the bound is read as inclusive, which may hold
        (
            {"properties": {"n": {"type": "number", "maximum": 1, "exclusiveMaximum": True}}},
            "result.n == 1",
        ),
    ],
)
def test_what_pins_nothing_refuses_nothing(schema: dict[str, Any], guard: str) -> None:
    assert _refused(guard, schema) == []


def test_a_const_of_a_falsy_value_pins_it() -> None:
    for value, other in ((0, "1"), (False, "true"), ("", '"x"'), (None, "1")):
        schema = {"properties": {"n": {"const": value}, "m": {"enum": []}}}
        assert [d.rule for d in _diagnostics(f"result.n == {other}", schema)] == [
            "gate-outcome-impossible"
        ]


def test_an_empty_enum_allows_no_answer() -> None:
    schema = {"properties": {"n": {"enum": []}}}
    diags = _diagnostics('result.n == "x"', schema)
    assert [str(d) for d in diags] == [_refusal('result.n == "x"', ["n"], {"n": ""})]


def test_too_many_combinations_are_not_weighed() -> None:
    """4096 combinations of pinned values are weighed; one more and the guard is passed over."""
    many = {f"f{i}": {"enum": [1, 2, 3, 4]} for i in range(6)}
    guard = " && ".join(f"result.f{i} == 1" for i in range(6)) + " && result.f0 == 9"
    assert [d.rule for d in _diagnostics(guard, {"properties": many})] == [
        "gate-outcome-impossible"
    ]
    more = {**many, "g": {"enum": [1, 2]}}
    guard_more = guard + " && result.g == 1"
    assert _diagnostics(guard_more, {"properties": more}) == []
    exact = {**many, "g": {"const": 1}}
    assert [d.rule for d in _diagnostics(guard_more, {"properties": exact})] == [
        "gate-outcome-impossible"
    ]


def test_a_field_schema_that_pins_nothing_does_not_hide_the_next() -> None:
    schema = {"properties": {"any": True, "m": {"const": 1}}}
    assert [d.rule for d in _diagnostics("result.m == 2", schema)] == ["gate-outcome-impossible"]
