"""The shortcut for plain lookups and comparisons must agree with CEL, value for value."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.core.expr import Expression, ExpressionError

SHAPES = [
    "result.score",
    "result.score > 7",
    "result.score >= -3",
    "result.score == 8",
    "result.score != 8",
    "result.score < 2.5",
    "result.name == 'a'",
    'result.name < "m"',
    "result.ok == true",
    "result.ok != false",
    "result.nested.value",
    "inputs",
]

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


def outcome(expression: Expression, activation: dict[str, Any]) -> tuple[str, Any]:
    try:
        return ("value", expression.evaluate(activation))
    except ExpressionError as exc:
        return ("error", str(exc))


@settings(max_examples=300, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    result=st.dictionaries(st.sampled_from(["score", "name", "ok", "nested"]), values, max_size=4),
    inputs=values,
)
def test_the_shortcut_agrees_with_cel(shape: str, result: dict[str, Any], inputs: Any) -> None:
    activation = {"result": result, "inputs": inputs}
    fast = Expression(shape)
    assert fast._fast is not None
    slow = Expression(shape)
    slow._fast = None
    assert outcome(fast, activation) == outcome(slow, activation)


def test_other_shapes_take_no_shortcut() -> None:
    for source in ("result.score > 7 && result.ok", "size(result.name) > 1", "has(result.x)"):
        assert Expression(source)._fast is None
