"""The shapes most expressions have, ``a.b.c``, ``a.b op literal`` and a literal alone,
evaluated without CEL when the values make the answer certain to be CEL's own; anything else is left
to :mod:`interlock.core.cel`. Converting an activation to CEL values costs more than
evaluating a small guard, and most guards are of these shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_PATH = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_FAST_PATH = re.compile(rf"^\s*({_PATH})\s*$")
_FAST_COMPARE = re.compile(
    rf"^\s*({_PATH})\s*(==|!=|<=|>=|<|>)\s*"
    r"(-?\d+\.\d+|-?\d+(?![\d.eEu])|\"[^\"\\]*\"|'[^'\\]*'|true|false)\s*$"
)
_FAST_LITERAL = re.compile(r"^\s*(-?\d+(?![\d.eEu])|\"[^\"\\]*\"|'[^'\\]*'|true|false)\s*$")
_INT64 = (-(2**63), 2**63 - 1)
MISS = object()
"""What a fast form answers when CEL must decide."""
_COMPARE = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _literal(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if text[0] in "\"'":
        return text[1:-1]
    return float(text) if "." in text else int(text)


def _plain(value: Any) -> bool:
    """A value whose CEL form converts back to itself (so a lookup may skip CEL)."""
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return True
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


class FastForm:
    """The two shapes most expressions have, ``a.b.c`` and ``a.b op literal``, evaluated
    without CEL when the values make the answer certain to be CEL's own (same types on
    both sides of a comparison, a value present at every step of a path). Anything else
    falls back to CEL, which also produces the errors."""

    __slots__ = ("literal", "op", "path")

    def __init__(self, path: tuple[str, ...], op: str | None = None, literal: Any = None):
        self.path = path
        self.op = op
        self.literal = literal

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        if not self.path:
            return self.literal  # a constant (a limit's one key for all: '"all"')
        if self.path[0] not in activation:
            return MISS
        node = activation[self.path[0]]
        if not _plain(node):
            return MISS  # CEL converts the whole variable, and would refuse it
        for key in self.path[1:]:
            if not isinstance(node, dict) or key not in node:
                return MISS
            node = node[key]
        if self.op is None:
            return node
        literal = self.literal
        if type(node) is not type(literal):
            return MISS  # mixed types: CEL decides (and may refuse)
        if isinstance(literal, bool) and self.op not in ("==", "!="):
            return MISS
        return _COMPARE[self.op](node, literal)


def fast_form(source: str, names: frozenset[str]) -> FastForm | None:
    match = _FAST_LITERAL.match(source)
    if match:
        value = _literal(match.group(1))
        in_range = not isinstance(value, int) or _INT64[0] <= value <= _INT64[1]
        return FastForm((), None, value) if in_range else None
    match = _FAST_PATH.match(source)
    if match:
        path = tuple(match.group(1).split("."))
        return FastForm(path) if path[0] in names else None
    match = _FAST_COMPARE.match(source)
    if match:
        path = tuple(match.group(1).split("."))
        if path[0] in names:
            return FastForm(path, match.group(2), _literal(match.group(3)))
    return None
