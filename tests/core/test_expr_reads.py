"""What an explanation shows an expression reading, and where a syntax error is."""

from __future__ import annotations

import pytest

from interlock.core.expr import ABSENT, CompileError, Expression, read_paths, read_values


@pytest.fixture(autouse=True)
def _uncached() -> None:
    """``read_paths`` keeps what it found per source: each test computes it afresh."""
    read_paths.cache_clear()


@pytest.mark.parametrize(
    ("source", "paths"),
    [
        (
            "result.score > 7 && result.error['class'] == 'x'",
            (("result", "score"), ("result", "error", "class")),
        ),
        (
            'inputs.m["a"].b + size(data.list[inputs.k])',
            (("inputs", "m", "a", "b"), ("data", "list"), ("inputs", "k")),
        ),
        ("result.error[inputs.k] == 1", (("result", "error"), ("inputs", "k"))),
        ("result.error[inputs.k]['class']", (("result", "error"), ("inputs", "k"))),
        ('result.a["b"]["c"].d', (("result", "a", "b", "c", "d"),)),
        ("result['''multi''']", (("result", "multi"),)),
        ('result["""multi"""] == 1', (("result", "multi"),)),
        ("result['']", (("result", ""),)),
        ("result[r'raw'] == result[R\"raw\"]", (("result", "raw"),)),
        ("result[r'a\\b'] || result['a\\'b']", (("result", "a\\b"), ("result",))),
        ("result[1] || result[b'a']", (("result",),)),
        ("result['a' + 'b']", (("result",),)),
        ("[result.a, result.a, inputs]", (("result", "a"), ("inputs",))),
        ("x.y == x", (("x", "y"),)),
        # a path ends where a method is called on it
        ("result.items.filter(x, x > 1).size() > 0", (("result", "items"),)),
        ("{'a': 1}.a == 1", ()),
        ("1 +", ()),
    ],
)
def test_read_paths_follow_literal_indexes_only(
    source: str, paths: tuple[tuple[str, ...], ...]
) -> None:
    assert read_paths(source) == paths


def test_a_syntax_error_names_its_line_and_column() -> None:
    with pytest.raises(CompileError) as caught:
        Expression("inputs.a +\n  )")
    assert (caught.value.message, caught.value.line, caught.value.col) == (
        "CEL does not compile: ')'",
        2,
        3,
    )


def test_read_values_shows_each_path_of_the_variables_given() -> None:
    expression = Expression("result.score > 7 || inputs.m['a'].b == 1 || inputs.gone.x")
    activation = {"inputs": {"m": {"a": {"b": 2}}}}
    assert read_values(expression, activation) == {"inputs.m.a.b": 2, "inputs.gone.x": ABSENT}
    assert read_values(expression, {"result": {"score": 8}}) == {"result.score": 8}
    assert read_values(expression, {"result": {"score": [1]}, "inputs": {"m": 3}}) == {
        "result.score": [1],
        "inputs.m.a.b": ABSENT,
        "inputs.gone.x": ABSENT,
    }
