"""CEL expressions, ``{{ cel }}`` templates and ``$.states`` references, as the manifest
language writes values.

A value in ``input``, ``set`` or ``outputs`` is a literal, a ``{{ cel }}`` template (a whole
string that is one expression keeps the expression's type) or a ``$.states.<s>.output.<k>``
reference; it is compiled once, when a manifest is loaded, and rendered against a run's
variables. The expressions themselves (compiling, their cost bounds, evaluating) are in
:mod:`interlock.core.cel`, the only module that knows celpy; this module is also where
callers find them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlock.core.cel import (
    ABSENT,
    COMPREHENSIONS,
    STEP_BUDGET,
    VARIABLES,
    BudgetExceeded,
    CelTypeError,
    CompileError,
    CostError,
    Expression,
    ExpressionError,
    OverBudget,
    is_literal_true,
    read_paths,
    read_values,
    to_json,
)

__all__ = [
    "ABSENT",
    "COMPREHENSIONS",
    "STEP_BUDGET",
    "VARIABLES",
    "BudgetExceeded",
    "CelTypeError",
    "CompileError",
    "CompiledValue",
    "CostError",
    "Expression",
    "ExpressionError",
    "Interpolation",
    "Literal",
    "Mapping_",
    "OverBudget",
    "Reference",
    "Sequence_",
    "Template",
    "ValueProblem",
    "compile_value",
    "expressions",
    "is_literal_true",
    "read_paths",
    "read_values",
    "references",
    "render",
    "to_json",
]

_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)


_REFERENCE = re.compile(r"^\$\.states\.([A-Za-z0-9_-]+)\.output((?:\.[A-Za-z0-9_-]+)*)$")


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any


@dataclass(frozen=True, slots=True)
class Template:
    """``"{{ expr }}"`` alone: the expression's value, keeping its type."""

    expression: Expression


@dataclass(frozen=True, slots=True)
class Interpolation:
    """Text with ``{{ expr }}`` parts: always a string."""

    parts: tuple[str | Expression, ...]


@dataclass(frozen=True, slots=True)
class Reference:
    """``$.states.<state>.output.<key>...``: a lookup, null when absent."""

    state: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Mapping_:
    items: tuple[tuple[str, CompiledValue], ...]


@dataclass(frozen=True, slots=True)
class Sequence_:
    items: tuple[CompiledValue, ...]


CompiledValue = Literal | Template | Interpolation | Reference | Mapping_ | Sequence_


@dataclass(frozen=True, slots=True)
class ValueProblem:
    """A template that does not compile, with its offset inside the string."""

    path: tuple[str | int, ...]
    error: CompileError
    offset: int


def compile_value(
    value: Any,
    extra: frozenset[str] = frozenset(),
    path: tuple[str | int, ...] = (),
    problems: list[ValueProblem] | None = None,
    *,
    doubles: bool = False,
) -> CompiledValue:
    """Compile a manifest value; template errors go to ``problems`` (or raise).
    ``doubles``: its expressions read numbers as a ``numbers: double`` workflow does."""
    if isinstance(value, dict):
        return Mapping_(
            tuple(
                (str(k), compile_value(v, extra, (*path, k), problems, doubles=doubles))
                for k, v in value.items()
            )
        )
    if isinstance(value, list):
        return Sequence_(
            tuple(
                compile_value(v, extra, (*path, i), problems, doubles=doubles)
                for i, v in enumerate(value)
            )
        )
    if not isinstance(value, str):
        return Literal(value)
    ref = _REFERENCE.match(value.strip())
    if ref:
        keys = tuple(k for k in ref.group(2).split(".") if k)
        return Reference(ref.group(1), keys)
    matches = list(_TEMPLATE.finditer(value))
    if not matches:
        return Literal(value)
    parts: list[str | Expression] = []
    cursor = 0
    for match in matches:
        if match.start() > cursor:
            parts.append(value[cursor : match.start()])
        try:
            parts.append(Expression(match.group(1).strip(), extra, doubles=doubles))
        except CompileError as exc:
            if problems is None:
                raise
            inner = match.group(1)
            lead = len(inner) - len(inner.lstrip())
            problems.append(ValueProblem(path, exc, match.start(1) + lead))
            parts.append(match.group(0))
        cursor = match.end()
    if cursor < len(value):
        parts.append(value[cursor:])
    if (
        len(parts) == 1
        and isinstance(parts[0], Expression)
        and value.strip() == matches[0].group(0)
    ):
        return Template(parts[0])
    return Interpolation(tuple(parts))


def references(value: CompiledValue) -> list[Reference]:
    """Every ``$.states`` reference inside a compiled value."""
    if isinstance(value, Reference):
        return [value]
    if isinstance(value, Mapping_):
        return [r for _, v in value.items for r in references(v)]
    if isinstance(value, Sequence_):
        return [r for v in value.items for r in references(v)]
    return []


def expressions(value: CompiledValue) -> list[Expression]:
    """Every CEL expression inside a compiled value."""
    if isinstance(value, Template):
        return [value.expression]
    if isinstance(value, Interpolation):
        return [p for p in value.parts if isinstance(p, Expression)]
    if isinstance(value, Mapping_):
        return [e for _, v in value.items for e in expressions(v)]
    if isinstance(value, Sequence_):
        return [e for v in value.items for e in expressions(v)]
    return []


def render(value: CompiledValue, activation: Mapping[str, Any]) -> Any:
    """Produce the plain value; raises :class:`ExpressionError` when a template fails."""
    if isinstance(value, Literal):
        return value.value
    if isinstance(value, Template):
        return value.expression.evaluate(activation)
    if isinstance(value, Interpolation):
        out: list[str] = []
        for part in value.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                rendered = part.evaluate(activation)
                out.append(rendered if isinstance(rendered, str) else _text(rendered))
        return "".join(out)
    if isinstance(value, Reference):
        node: Any = activation.get("states", {}).get(value.state, {}).get("output")
        for key in value.keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node
    if isinstance(value, Mapping_):
        return {k: render(v, activation) for k, v in value.items}
    return [render(v, activation) for v in value.items]


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        import json  # local: only interpolations of structured values need it

        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


# --- what an expression reads (for explanations) ---------------------------------------
