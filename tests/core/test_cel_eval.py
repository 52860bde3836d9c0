"""What an expression may cost, and how its failures read: the step budget, the
comprehension found inside another (refused when compiled), the errors of evaluation and
of converting the values, and the CEL values a result comes back from."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core.expr import (
    STEP_BUDGET,
    CompileError,
    CostError,
    Expression,
    ExpressionError,
    OverBudget,
)


def test_an_evaluation_that_runs_out_of_steps_stops_with_over_budget() -> None:
    costly = Expression("inputs.xs.all(x, x >= 0)")
    assert costly.loops
    assert costly.evaluate({"inputs": {"xs": list(range(600))}}) is True
    with pytest.raises(OverBudget) as caught:
        costly.evaluate({"inputs": {"xs": list(range(2_000))}})
    assert str(caught.value) == (
        f"evaluation stopped after {STEP_BUDGET:,} steps (its budget): "
        "the expression costs too much on these values"
    )
    assert isinstance(caught.value, ExpressionError)


def test_the_budget_is_per_evaluation() -> None:
    costly = Expression("inputs.xs.all(x, x >= 0)")
    half = {"inputs": {"xs": list(range(600))}}
    for _ in range(3):  # 3 x 600 items: more than one budget in all
        assert costly.evaluate(half) is True


@pytest.mark.parametrize(
    ("source", "word", "col"),
    [
        ("inputs.xs.all(x, inputs.ys.exists(y, y == x))", "exists", 28),
        ("inputs.xs.map(x, [x].filter(y, y > 0))", "filter", 22),
        ("inputs.xs.exists(x, inputs.ys.all(y, y > x))", "all", 31),
        ("inputs.xs.filter(x, x.ys.exists_one(y, y))", "exists_one", 26),
        ("inputs.xs.all(x,\n  inputs.ys.map(y, y))", "map", 13),
        # Other method calls, with arguments or without, before or after it.
        ("inputs.s.size() > 0 && inputs.xs.all(x, inputs.ys.all(y, y))", "ys.all", 51),
        ("inputs.s.startsWith('a') && inputs.xs.all(x, inputs.ys.all(y, y))", "ys.all", 56),
        ("inputs.xs.all(x, inputs.ys.all(y, y)) && inputs.s.size() > 0", "ys.all", 28),
        ("inputs.xs.all(x, inputs.ys.all(y, y)) && inputs.s.endsWith('a')", "ys.all", 28),
    ],
)
def test_a_comprehension_inside_another_is_refused_at_its_place(
    source: str, word: str, col: int
) -> None:
    with pytest.raises(CostError) as caught:
        Expression(source)
    word = word.removeprefix("ys.")
    assert caught.value.message == (
        f"{word!r} inside another comprehension: the cost is the product of the lists' "
        "sizes (split it into steps, or compute it in an action)"
    )
    assert caught.value.col == col
    assert caught.value.line == source[: source.find(word)].count("\n") + 1


@pytest.mark.parametrize(
    ("source", "loops"),
    [
        ("inputs.xs.filter(x, x > 0).all(y, y > 1)", True),  # one after the other
        ("inputs.xs.all(x, size(x) > 0)", True),
        ("inputs.xs.exists_one(x, x > 0)", True),
        ("inputs.xs.map(x, x.all)", True),  # a field named like a macro
        ("size(inputs.xs) > 0", False),
        ("inputs.all == inputs.map", False),
        ("has(inputs.filter)", False),
    ],
)
def test_comprehensions_side_by_side_are_allowed(source: str, loops: bool) -> None:
    assert Expression(source).loops is loops


def test_names_are_the_variables_an_expression_reads() -> None:
    assert Expression("inputs.a + size(result.b)").names == frozenset({"inputs", "result"})
    assert Expression("inputs.xs.all(x, x > 0)").names == frozenset({"inputs"})
    assert Expression("item.n > 1", frozenset({"item"})).names == frozenset({"item"})
    assert Expression("1 + 2").names == frozenset()


@pytest.mark.parametrize(
    ("source", "activation", "message"),
    [
        ("inputs.n / 0", {"inputs": {"n": 1}}, "divide by zero"),
        ("inputs.x + 1", {"inputs": {"x": 2**64}}, "overflow"),
        ("inputs.missing", {"inputs": {}}, "no such member in mapping: 'missing'"),
        # an error inside a map or a list the expression builds is the expression's error
        ('{"diff": inputs.missing}', {"inputs": {}}, "no such member in mapping: 'missing'"),
        ("[1, inputs.missing]", {"inputs": {}}, "no such member in mapping: 'missing'"),
        ("int(inputs.s)", {"inputs": {"s": "x"}}, ""),
    ],
)
def test_a_failed_evaluation_is_an_expression_error(
    source: str, activation: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExpressionError) as caught:
        Expression(source).evaluate(activation)
    assert not isinstance(caught.value, OverBudget)
    assert message in str(caught.value)
    assert str(caught.value)


def test_a_variable_not_given_is_an_error_not_a_null() -> None:
    with pytest.raises(ExpressionError):
        Expression("result.x == 1").evaluate({"inputs": {}})
    with pytest.raises(ExpressionError):
        Expression("result == null").evaluate({"inputs": {}})


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("1u + 2u", 3),
        ("-7", -7),
        ("2.5 * 2.0", 5.0),
        ("true && !false", True),
        ("null", None),
        ("'a' + 'b'", "ab"),
        ("b'hi'", "aGk="),
        ("[1, [2u], {'k': null}]", [1, [2], {"k": None}]),
        ("{1: 'a', 'b': 2.0}", {"1": "a", "b": 2.0}),
        ('duration("1m30s")', "90s"),
        ('timestamp("2026-03-01T09:00:00Z")', "2026-03-01T09:00:00Z"),
    ],
)
def test_results_come_back_as_plain_json(source: str, value: Any) -> None:
    got = Expression(source).evaluate({})
    assert got == value
    assert type(got) is type(value)


def test_a_cel_type_comes_back_as_text() -> None:
    assert isinstance(Expression("type(1)").evaluate({}), str)


def test_an_expression_shows_its_source() -> None:
    assert repr(Expression("inputs.a > 1")) == "Expression('inputs.a > 1')"
    assert Expression(" inputs.a ").source == " inputs.a "


def test_a_compile_error_reads_as_its_message() -> None:
    with pytest.raises(CompileError) as caught:
        Expression("inputs.a +")
    assert str(caught.value) == caught.value.message
    assert caught.value.message.startswith("CEL does not compile: ")


@pytest.mark.parametrize(
    ("source", "name", "line", "col"),
    [
        ("nope + nope", "nope", 1, 1),
        ("inputs.nope == nope", "nope", 1, 16),  # not the field of the same name before it
        ("inputs.a > 1 &&\n  nope.b", "nope", 2, 3),
        ("zed + abc", "zed", 1, 1),  # the first one read, whichever its name
        ("inputs.xs.all(x, x > y)", "y", 1, 22),
    ],
)
def test_an_unknown_variable_is_reported_where_it_is_first_read(
    source: str, name: str, line: int, col: int
) -> None:
    with pytest.raises(CompileError) as caught:
        Expression(source)
    assert caught.value.message == (
        f"unknown variable {name!r} in CEL "
        "(known: context, data, event, inputs, result, run, states)"
    )
    assert (caught.value.line, caught.value.col) == (line, col)


@pytest.mark.parametrize("source", [None, 5, b"inputs.a"])
def test_a_source_that_is_not_text_is_a_compile_error_at_its_start(source: Any) -> None:
    with pytest.raises(CompileError) as caught:
        Expression(source)
    assert caught.value.message.startswith("CEL does not compile: ")
    assert len(caught.value.message) > len("CEL does not compile: ")
    assert (caught.value.line, caught.value.col) == (1, 1)


@pytest.mark.parametrize(
    "source", ["inputs.s.startsWith('a')", "inputs.s.size() > 0", "inputs.xs.all()"]
)
def test_a_method_call_that_is_not_a_comprehension_is_no_loop(source: str) -> None:
    assert Expression(source).loops is False


def test_a_macro_name_called_without_arguments_fails_when_evaluated() -> None:
    expression = Expression("inputs.xs.all()")
    with pytest.raises(ExpressionError) as caught:
        expression.evaluate({"inputs": {"xs": [1]}})
    assert str(caught.value)


def test_cel_types_come_back_as_different_texts() -> None:
    int_type = Expression("type(1)").evaluate({})
    assert int_type == Expression("type(2)").evaluate({})
    assert int_type != Expression("type('a')").evaluate({})
    assert "Int" in int_type


@pytest.mark.parametrize(
    ("source", "name"), [("inputs.a.shout()", "shout"), ("largest(inputs.a, 2)", "largest")]
)
def test_an_unknown_function_is_named_without_the_values_given(source: str, name: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        # A value that holds the text celpy's dump begins with does not cut it elsewhere.
        Expression(source).evaluate({"inputs": {"a": "a secret (in activation x)"}})
    assert str(caught.value) == f"undeclared reference to {name!r}"


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("string(inputs.ok)", "true"),
        ('"approved: " + string(false)', "approved: false"),
        ('string(duration("1.5s"))', "1.5s"),
        ('string(duration("4h"))', "14400s"),
        ("string(inputs.n)", "3"),
        ("string(2.5)", "2.5"),
        ('string("as is")', "as is"),
        ('string(timestamp("2026-01-01T00:00:00Z"))', "2026-01-01T00:00:00Z"),
    ],
)
def test_string_converts_as_cel_does_not_as_python_does(source: str, text: str) -> None:
    """``string(true)`` is "true" in CEL (Python wrote "True"); a duration keeps its
    fraction (Python's conversion cut "1.5s" to "1s"). With ``numbers: double`` too."""
    activation = {"inputs": {"ok": True, "n": 3}}
    assert Expression(source).evaluate(activation) == text
    assert Expression(source, doubles=True).evaluate(activation) == text


@pytest.mark.parametrize("source", ["string(null)", "string([1, 2])", 'string({"a": 1})'])
def test_a_value_with_no_string_is_an_error_not_python_s_repr(source: str) -> None:
    with pytest.raises(ExpressionError, match="no such overload"):
        Expression(source).evaluate({})
