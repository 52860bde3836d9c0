"""Values in manifests: ``{{ cel }}`` templates, text with templates in it, ``$.states``
references, and how CEL values come back as JSON."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core.expr import (
    CompileError,
    Expression,
    ExpressionError,
    Interpolation,
    Literal,
    Reference,
    Template,
    ValueProblem,
    compile_value,
    expressions,
    references,
    render,
)


def text(template: str, **inputs: Any) -> Any:
    return render(compile_value(template), {"inputs": inputs})


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (7, "7"),
        (1.5, "1.5"),
        ("plain", "plain"),
        ({"b": [1, None], "a": "x"}, '{"a":"x","b":[1,null]}'),  # compact, keys sorted
        ([True, {"k": False}], '[true,{"k":false}]'),
    ],
)
def test_text_shows_each_json_value_as_json(value: Any, shown: str) -> None:
    assert text("[{{ inputs.v }}]", v=value) == f"[{shown}]"


def test_a_template_alone_keeps_the_type_and_text_makes_a_string() -> None:
    assert isinstance(compile_value("{{ inputs.n }}"), Template)
    assert text("  {{ inputs.n }} ", n=3) == "  3 "  # surrounding text makes it text
    assert text("{{ inputs.n }}", n=3) == 3
    assert text("{{ inputs.n }}", n=None) is None
    assert isinstance(compile_value("n={{ inputs.n }}"), Interpolation)
    assert text("n={{ inputs.n }}", n=3) == "n=3"
    assert text("{{ inputs.a }}{{ inputs.b }}", a=1, b=2) == "12"
    assert text("{{ inputs.a }} and {{ inputs.b }}!", a="x", b=None) == "x and null!"
    assert compile_value("no template") == Literal("no template")
    assert compile_value(4) == Literal(4)


def test_cel_timestamps_durations_and_bytes_come_back_as_text() -> None:
    later = Expression('timestamp("2026-03-01T09:00:00Z") + duration("90s")')
    assert later.evaluate({}) == "2026-03-01T09:01:30Z"
    with_offset = Expression('timestamp("2026-03-01T09:00:00.5+02:00")')
    # as CEL in Go writes them: no trailing zeros in a fraction, none for whole seconds
    assert with_offset.evaluate({}) == "2026-03-01T09:00:00.5+02:00"
    assert Expression('duration("90s")').evaluate({}) == "90s"
    assert Expression('duration("1.25s")').evaluate({}) == "1.25s"
    assert Expression('b"hi"').evaluate({}) == "aGk="  # base64
    assert Expression("[1u, 2.5, 'x', null]").evaluate({}) == [1, 2.5, "x", None]
    assert Expression("{'a': {1: true}}").evaluate({}) == {"a": {"1": True}}


def test_an_unknown_variable_is_named_with_its_column() -> None:
    with pytest.raises(CompileError) as caught:
        Expression("inputs.a + nope.b")
    error = caught.value
    assert error.message == (
        "unknown variable 'nope' in CEL (known: context, data, event, inputs, result, run, states)"
    )
    assert (error.line, error.col) == (1, 12)
    with pytest.raises(CompileError) as at_start:
        Expression("nope", frozenset({"item"}))
    assert at_start.value.col == 1
    assert "item" in at_start.value.message
    assert str(at_start.value) == at_start.value.message


def test_a_syntax_error_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match=r"^CEL does not compile: '"):
        Expression("1 +")


def test_evaluation_errors_are_expression_errors() -> None:
    with pytest.raises(ExpressionError, match="no such member in mapping: 'missing'"):
        Expression("inputs.missing.deeper").evaluate({"inputs": {}})
    with pytest.raises(ExpressionError):
        Expression("inputs.n / 0").evaluate({"inputs": {"n": 1}})


def test_references_are_found_anywhere_in_a_value() -> None:
    value = compile_value(
        {
            "a": ["$.states.s1.output.x", {"b": "$.states.s2.output"}],
            "c": " $.states.s3.output.k.j ",
            "d": "not $.states.s4.output",
        }
    )
    assert references(value) == [
        Reference("s1", ("x",)),
        Reference("s2", ()),
        Reference("s3", ("k", "j")),
    ]
    assert references(compile_value("$.states.s1.output")) == [Reference("s1", ())]
    assert references(compile_value(["{{ inputs.a }}"])) == []


def test_a_reference_is_null_where_the_output_has_no_such_key() -> None:
    states = {"s1": {"output": {"x": {"y": 5}, "flat": 3}}}
    activation = {"states": states}
    assert render(compile_value({"a": ["$.states.s1.output.x.y"]}), activation) == {"a": [5]}
    assert render(compile_value("$.states.s1.output.flat.y"), activation) is None
    assert render(compile_value("$.states.s1.output.nope"), activation) is None
    assert render(compile_value("$.states.s9.output.x"), activation) is None
    assert render(compile_value("$.states.s1.output"), activation) == states["s1"]["output"]
    assert render(compile_value("$.states.s1.output.x"), {}) is None


def test_template_errors_in_list_items_and_maps_are_each_reported() -> None:
    problems: list[ValueProblem] = []
    value = compile_value(
        {"a": ["fine", "{{ 1 + }}", {"b": "c {{ nope }}"}], "d": "{{   nope2 }}"},
        frozenset(),
        ("root",),
        problems,
    )
    assert [(p.path, p.offset) for p in problems] == [
        (("root", "a", 1), 3),
        (("root", "a", 2, "b"), 5),
        (("root", "d"), 5),
    ]
    assert problems[0].error.message.startswith("CEL does not compile")
    assert "'nope'" in problems[1].error.message
    assert "'nope2'" in problems[2].error.message
    assert expressions(value) == []  # nothing compiled to evaluate
    with pytest.raises(CompileError, match="'nope'"):
        compile_value(["ok", ["{{ nope }}"]])


def test_expressions_lists_every_compiled_expression() -> None:
    value = compile_value({"a": ["{{ inputs.a }}", "x {{ inputs.b }} {{ inputs.c }}"]})
    assert [e.source for e in expressions(value)] == ["inputs.a", "inputs.b", "inputs.c"]
    assert expressions(compile_value("$.states.s.output")) == []
