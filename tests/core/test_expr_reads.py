"""What an explanation shows an expression reading, and where a syntax error is."""

from __future__ import annotations

import pytest

from interlock.core.expr import CompileError, Expression, read_paths


@pytest.mark.parametrize(
    ("source", "paths"),
    [
        (
            "result.score > 7 && result.error['class'] == 'x'",
            (("result", "score"), ("result", "error", "class")),
        ),
        (
            'inputs.m["a"].b + size(data.list[inputs.k])',
            (("inputs", "m", "a", "b"), ("data", "list")),
        ),
        ("result.error[inputs.k] == 1", (("result", "error"),)),
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
