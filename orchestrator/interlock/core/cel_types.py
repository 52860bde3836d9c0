"""The operand types CEL fixes before a run: an arithmetic operator given literals (or what
literals make) of types it has no overload for, as ``"a" + 1``, fails at every evaluation
whatever the run's values, so ``validate`` reports it where it stands.

Only what is certain is reported: a value read from ``inputs``, ``result``, ``data`` or the
context has no type before the run (JSON decides it), nor has a function's result, and two
numbers of different kinds are left to the evaluator (the numbers setting decides how they
mix). Everything else about types is checked at run time: a guard that errors there does not
fire and is recorded (``guard.failed``)."""

from __future__ import annotations

from typing import Any

_LITERALS = {
    "INT_LIT": "int",
    "UINT_LIT": "uint",
    "FLOAT_LIT": "double",
    "STRING_LIT": "string",
    "MLSTRING_LIT": "string",
    "BYTES_LIT": "bytes",
    "BOOL_LIT": "bool",
    "NULL_LIT": "null",
}
_NUMBERS = frozenset({"int", "uint", "double"})
_ADDABLE = frozenset({"int", "uint", "double", "string", "bytes"})
_OPERATORS = {
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
}
_PASS_THROUGH = frozenset(
    {
        "expr",
        "conditionalor",
        "conditionaland",
        "relation",
        "addition",
        "multiplication",
        "unary",
        "member",
        "primary",
        "paren_expr",
        "literal",
    }
)


def mistyped(tree: Any) -> tuple[str, int, int] | None:
    """The first operator of a compiled CEL tree (lark) given operands of types it takes
    no overload for, known before the run: (message, line, column), or None."""
    found: list[tuple[str, int, int]] = []
    _type_of(tree, found)
    return found[0] if found else None


def _type_of(node: Any, found: list[tuple[str, int, int]]) -> str | None:
    """The CEL type ``node`` certainly has (None: not known before the run); each operator
    refused on the way is added to ``found``."""
    if not hasattr(node, "data"):  # a token
        return _LITERALS.get(getattr(node, "type", ""))
    kids = node.children
    if node.data in ("addition", "multiplication") and len(kids) == 2:
        operation, right = kids
        op = _OPERATORS.get(getattr(operation, "data", ""))
        if op is not None and len(operation.children) == 1:
            left = operation.children[0]
            a, b = _type_of(left, found), _type_of(right, found)
            if a is None or b is None:
                return None
            if a in _NUMBERS and b in _NUMBERS:
                return a if a == b else None
            if op == "+" and a == b and a in _ADDABLE:
                return a
            line, col = _start(left)
            found.append(
                (
                    f"{op!r} of {a} and {b}: CEL has no such operator, and the expression "
                    "fails whatever the run's values (convert one side: string(x), int(x), "
                    "double(x))",
                    line,
                    col,
                )
            )
            return None
    if node.data in _PASS_THROUGH and len(kids) == 1:
        return _type_of(kids[0], found)
    for kid in kids:
        if hasattr(kid, "data"):
            _type_of(kid, found)
    return None


def _start(node: Any) -> tuple[int, int]:
    """The line and column (1-based) of ``node``'s first token."""
    for token in node.scan_values(lambda v: hasattr(v, "line")):
        return int(token.line or 1), int(token.column or 1)
    return 1, 1
