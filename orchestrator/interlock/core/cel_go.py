"""What cel-go does that celpy does not, for values: numbers compared across kinds and
read as JSON's one number type where a workflow asks for doubles, and the text of a
value (``string()``, a duration, a timestamp) as cel-go writes it, so that an expression
gives the same answer whichever implementation a workflow was written against.

celpy is imported inside the functions that need it, on first use (as :mod:`cel` does)."""

from __future__ import annotations

import functools
from typing import Any


def as_doubles(value: Any) -> Any:
    """``value`` with every number a float, as JSON has one number type (Go reads them so)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, list):
        return [as_doubles(v) for v in value]
    if isinstance(value, dict):
        return {k: as_doubles(v) for k, v in value.items()}
    return value


_WHOLE = 2.0**53
"""Doubles up to this magnitude hold whole numbers exactly."""


def whole_numbers(value: Any) -> Any:
    """``value`` with every whole float an int (``80.0`` -> ``80``), as Go writes a
    float64 in JSON: a number computed as a double reads the same whichever way its
    inputs were spelled."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _WHOLE:
        return int(value)
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    return value


@functools.cache
def mixed_numbers() -> dict[str, Any]:
    """CEL's comparisons across int, uint and double (``1 == 1.0``, ``80.0 <= 100``), which
    cel-go makes and celpy does not: numbers of two kinds compare by value."""
    import operator

    import celpy
    from celpy import celtypes

    base = celpy.evaluation.base_functions
    numbers = (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)

    def mixed(a: Any, b: Any) -> bool:
        return (
            isinstance(a, numbers)
            and isinstance(b, numbers)
            and not isinstance(a, celtypes.BoolType)
            and not isinstance(b, celtypes.BoolType)
            and type(a) is not type(b)
        )

    def across(name: str, op: Any) -> Any:
        own = base[name]

        def compare(a: Any, b: Any) -> Any:
            if mixed(a, b):
                return celtypes.BoolType(op(float(a), float(b)))
            return own(a, b)

        return compare

    ops = {
        "_==_": operator.eq,
        "_!=_": operator.ne,
        "_<_": operator.lt,
        "_<=_": operator.le,
        "_>_": operator.gt,
        "_>=_": operator.ge,
    }
    return {name: across(name, op) for name, op in ops.items()}


@functools.cache
def conversions(doubles: bool) -> dict[str, Any]:
    """CEL's ``string()`` as the spec (and cel-go) has it, where celpy leaks Python's
    text: ``string(true)`` is ``"true"`` (not ``"True"``), a duration keeps its fraction
    (``"1.5s"``, not ``"1s"``), and a null, a list or a map has no string (an error, not
    Python's repr). With ``doubles`` (``numbers: double``), a whole double is written as
    the number it is (``"3"`` for the JSON ``3``), as :func:`whole_numbers` writes it."""
    import celpy
    from celpy import celtypes

    own = celpy.evaluation.base_functions["string"]

    def string(value: Any) -> Any:
        if isinstance(value, celtypes.BoolType):
            return celtypes.StringType("true" if value else "false")
        if isinstance(value, celtypes.DurationType):
            return celtypes.StringType(seconds_text(value.total_seconds()))
        if doubles and isinstance(value, celtypes.DoubleType):
            return celtypes.StringType(str(whole_numbers(float(value))))
        if value is None or isinstance(value, celtypes.ListType | celtypes.MapType):
            kind = "null" if value is None else type(value).__name__.removesuffix("Type")
            raise TypeError(f"no such overload: string({kind.lower()})")
        return own(value)

    return {"string": string}


def seconds_text(seconds: float) -> str:
    """A duration as CEL writes it: its seconds, the fraction only when there is one
    (``"14400s"``, ``"1.5s"``), never an exponent."""
    from decimal import Decimal

    return format(Decimal(repr(seconds)).normalize(), "f") + "s"


def fraction_trimmed(text: str) -> str:
    """An RFC 3339 time without the trailing zeros of its fraction, as Go writes it
    (``12:27:24.164Z``, not ``12:27:24.164000Z``): the moment a run records reads the
    same when an expression gives it back."""
    head, dot, rest = text.partition(".")
    if not dot:
        return text
    digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
    trimmed = digits.rstrip("0")
    return head + ("." + trimmed if trimmed else "") + rest[len(digits) :]
