"""CEL expressions: the only module that knows celpy.

Everything is compiled once, when a manifest is loaded. Evaluation converts only the
top-level variables an expression references, since converting an activation to CEL values
costs more than evaluating a small guard.

What an expression may cost is bounded twice. Statically, a comprehension (``all``,
``exists``, ``exists_one``, ``map``, ``filter``) inside the body of another is refused when
the expression is compiled (:class:`CostError`, rule ``cel-cost``): its cost is the product
of the lists' sizes, which the inputs choose. At run time every evaluation has a budget of
``STEP_BUDGET`` steps (nodes of the expression visited, counted by the interpreter, so the
count is the same on every machine and every replay); an evaluation that runs out stops
with an :class:`ExpressionError`, recorded like any other (a ``guard.failed``, or the run
failing with ``expression_error``). A guard costs about 60 steps; ``all`` over 600 items
about 10,000.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from interlock.core.cel_fast import MISS, fast_form
from interlock.core.cel_go import (
    as_doubles,
    conversions,
    fraction_trimmed,
    mixed_numbers,
    seconds_text,
    whole_numbers,
)
from interlock.core.cel_types import mistyped
from interlock.core.rfc3339 import format_time
from interlock.core.vocabulary import InterlockError

if TYPE_CHECKING:
    import celpy
    import lark

STEP_BUDGET = 20_000
"""Steps one evaluation may take (about half a second of celpy on a busy 2-core machine)."""

COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})

VARIABLES = frozenset({"event", "data", "result", "context", "inputs", "states", "run"})
"""Names an expression may read; loop and map constructs add their own item variable."""


class ExpressionError(InterlockError):
    """An expression failed to compile or to evaluate."""


class OverBudget(ExpressionError):
    """An evaluation stopped at its step budget: the values it met cost too much."""


@dataclass(frozen=True, slots=True)
class CompileError(InterlockError):
    """A CEL expression does not compile: ``line``/``col`` are 1-based, inside the source."""

    message: str
    line: int
    col: int

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class CostError(CompileError):
    """A CEL expression whose cost cannot be bounded before it runs (rule ``cel-cost``)."""


@dataclass(frozen=True, slots=True)
class CelTypeError(CompileError):
    """A CEL operator given operands whose types it takes none of, known before the run
    (rule ``cel-type``)."""


class BudgetExceeded(Exception):
    """Raised inside the interpreter when an evaluation has used up its steps."""


@functools.cache
def _cel() -> SimpleNamespace:
    """celpy, imported on first use: commands that compile no CEL (most of the CLI) do
    not pay for importing it."""
    import celpy
    import lark
    from celpy import celtypes
    from celpy.adapter import json_to_cel
    from celpy.celparser import CELParseError
    from celpy.evaluation import CELEvalError, Evaluator

    class Budgeted(Evaluator):
        """celpy's interpreter, counting every node it visits against a budget shared
        with the evaluators of nested macros."""

        def __init__(self, ast: Any, activation: Any, budget: list[int]) -> None:
            super().__init__(ast, activation)
            self._budget = budget

        def sub_evaluator(self, ast: Any) -> Budgeted:
            return Budgeted(ast, self.activation, self._budget)

        def _visit_tree(self, tree: Any) -> Any:
            self._budget[0] -= 1
            if self._budget[0] < 0:
                raise BudgetExceeded
            return super()._visit_tree(tree)

    class BudgetedRunner(celpy.InterpretedRunner):
        def evaluate(self, context: Any) -> Any:
            evaluator = Budgeted(self.ast, self.new_activation(), [STEP_BUDGET])
            return evaluator.evaluate(context)

    return SimpleNamespace(
        celpy=celpy,
        runner=BudgetedRunner,
        lark=lark,
        celtypes=celtypes,
        json_to_cel=json_to_cel,
        CELParseError=CELParseError,
        CELEvalError=CELEvalError,
    )


@functools.cache
def _env() -> celpy.Environment:
    """Built on first use: it costs about half a second, which commands that compile no
    CEL should not pay."""
    env: celpy.Environment = _cel().celpy.Environment(runner_class=_cel().runner)
    return env


def _variable_reads(tree: lark.Tree[lark.Token]) -> list[tuple[int, int, str]]:
    """Where each top-level identifier is read (``result`` in ``result.score > 7``), in
    source order: line and column (1-based, inside the source) and name."""
    reads = []
    for node in tree.iter_subtrees():
        if node.data == "ident":  # ident_arg is a function call (size, has, int...)
            token = node.children[0]  # an ident is one IDENT token
            if isinstance(token, _cel().lark.Token):
                reads.append((cast(int, token.line), cast(int, token.column), str(token)))
    return sorted(reads)


def _nested_comprehension(tree: lark.Tree[lark.Token]) -> lark.Token | None:
    """The method token of a comprehension found inside another comprehension's body."""
    for node in tree.iter_subtrees():
        if node.data != "member_dot_arg" or len(node.children) < 3:
            continue
        method = node.children[1]
        if str(method) not in COMPREHENSIONS:
            continue
        body = node.children[2]
        if not isinstance(body, _cel().lark.Tree):
            continue
        for inner in body.iter_subtrees():
            if inner.data == "member_dot_arg" and len(inner.children) >= 2:
                token = inner.children[1]
                if str(token) in COMPREHENSIONS:
                    found: lark.Token = token
                    return found
    return None


def _has_comprehension(tree: lark.Tree[lark.Token]) -> bool:
    return any(
        node.data == "member_dot_arg"
        and len(node.children) >= 3
        and str(node.children[1]) in COMPREHENSIONS
        for node in tree.iter_subtrees()
    )


_MACRO_BINDERS = re.compile(r"\.(?:all|exists|exists_one|map|filter)\(\s*([A-Za-z_]\w*)\s*,")


class Expression:
    """A compiled CEL expression. ``doubles``: every JSON number it reads is a CEL double
    and numbers compare across int and double, as CEL in Go reads JSON (a workflow's
    ``numbers: double``); a whole double it gives comes out as a JSON integer."""

    __slots__ = ("_fast", "_program", "doubles", "loops", "names", "source")

    def __init__(
        self,
        source: str,
        extra: frozenset[str] = frozenset(),
        *,
        doubles: bool = False,
        sees: frozenset[str] | None = None,
    ) -> None:
        """``sees``: the variables where it stands may read, named when it reads one it
        does not know (None: every variable, ``extra`` with them)."""
        self.source = source
        self.doubles = doubles
        try:
            tree = _env().compile(source)
        except _cel().CELParseError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "syntax error"
            line = int(getattr(exc, "line", None) or 1)
            col = int(getattr(exc, "column", None) or 1)
            raise CompileError(f"CEL does not compile: {first.strip()!r}", line, col) from exc
        except Exception as exc:  # celpy raises a few other types on odd input
            raise CompileError(f"CEL does not compile: {exc}", 1, 1) from exc
        nested = _nested_comprehension(tree)
        if nested is not None:
            raise CostError(
                f"{str(nested)!r} inside another comprehension: the cost is the product of "
                "the lists' sizes (split it into steps, or compute it in an action)",
                int(getattr(nested, "line", None) or 1),
                int(getattr(nested, "column", None) or 1),
            )
        wrong = mistyped(tree)
        if wrong is not None:
            raise CelTypeError(*wrong)
        self.loops = _has_comprehension(tree)
        """Its cost grows with the values it meets (a comprehension walks a list): up to
        its whole step budget, where any other expression costs a few steps."""
        reads = _variable_reads(tree)
        names = frozenset(name for _, _, name in reads)
        bound = frozenset(_MACRO_BINDERS.findall(source))
        unknown = [read for read in reads if read[2] not in VARIABLES | extra | bound]
        if unknown:
            # The first one read, where it is read (not a field of the same name before it).
            line, col, name = unknown[0]
            known = ", ".join(sorted(VARIABLES | extra if sees is None else sees))
            raise CompileError(f"unknown variable {name!r} in CEL (known: {known})", line, col)
        self.names = names & (VARIABLES | extra)
        functions = {**conversions(doubles), **(mixed_numbers() if doubles else {})}
        self._program = _env().program(tree, functions)
        self._fast = None if doubles else fast_form(source, self.names)

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        """Evaluate over plain JSON-like values; returns plain JSON-like values."""
        if self._fast is not None:
            value = self._fast.evaluate(activation)
            if value is not MISS:
                return value
        try:
            # Inside the try: converting can fail too (an integer beyond 64 bits, say).
            json_to_cel = _cel().json_to_cel
            read = as_doubles if self.doubles else _same
            cel_activation = {
                name: json_to_cel(read(activation[name]))
                for name in self.names
                if name in activation
            }
            value = self._program.evaluate(cel_activation)
        except BudgetExceeded:
            raise OverBudget(
                f"evaluation stopped after {STEP_BUDGET:,} steps (its budget): "
                "the expression costs too much on these values"
            ) from None
        except Exception as exc:
            raise ExpressionError(_describe(exc)) from exc
        if isinstance(value, _cel().CELEvalError):
            raise ExpressionError(_describe(value))
        plain = to_json(value)
        return whole_numbers(plain) if self.doubles else plain

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


def _same(value: Any) -> Any:
    return value


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _cel().CELEvalError) and exc.args:
        # An undeclared function comes with celpy's whole activation (every value given,
        # every function known) appended: kilobytes that would go into the run's log.
        return str(exc.args[0]).split(" (in activation ", 1)[0]
    return str(exc) or type(exc).__name__


def to_json(value: Any) -> Any:
    """Turn a CEL value into a plain JSON value. An error inside a list or a map (celpy
    builds ``{"a": x.missing}`` with the error as its value) is the expression's error."""
    if isinstance(value, _cel().CELEvalError):
        raise ExpressionError(_describe(value))
    celtypes = _cel().celtypes
    if value is None or isinstance(value, celtypes.NullType):
        return None
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.BytesType):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, celtypes.ListType):
        return [to_json(v) for v in value]
    if isinstance(value, celtypes.MapType):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, celtypes.TimestampType):
        return fraction_trimmed(format_time(value, "auto", utc=False))
    if isinstance(value, celtypes.DurationType):
        return seconds_text(value.total_seconds())
    if isinstance(value, bool | int | float | str | list | dict):
        return value
    return str(value)


def is_literal_true(value: Any) -> bool:
    """A guard fires only on a literal boolean ``true``."""
    return value is True


# --- values: literals, templates and references ----------------------------------------


@functools.cache
def read_paths(source: str) -> tuple[tuple[str, ...], ...]:
    """The variable paths an expression reads, outermost first and in source order:
    ``result.score > 7 && result.error['class'] == 'x'`` reads ``("result", "score")`` and
    ``("result", "error", "class")``. A path ends where an index is not a literal
    (``result.error[inputs.k].x`` reads ``result.error``, and ``inputs.k``)."""
    try:
        tree = _env().compile(source)
    # Celpy raises assorted errors: no paths.
    except Exception:  # noqa: BLE001
        return ()
    found: list[tuple[str, ...]] = []

    def path_of(node: Any) -> tuple[tuple[str, ...], bool] | None:
        """The path ``node`` reads and whether it goes on past its end (False once an
        index that is not a literal ended it: ``result.error[k].x`` reads ``result.error``)."""
        lark_mod = _cel().lark
        if not isinstance(node, lark_mod.Tree):
            return None
        if node.data == "member" and len(node.children) == 1:
            return path_of(node.children[0])
        if node.data == "primary" and len(node.children) == 1:
            child = node.children[0]
            if isinstance(child, lark_mod.Tree) and child.data == "ident":
                token = child.children[0]
                return (str(token),), True
            return None
        if node.data == "member_dot" and len(node.children) == 2:
            base = path_of(node.children[0])
            name = node.children[1]
            if base is None or not isinstance(name, lark_mod.Token):
                return None
            return ((*base[0], str(name)), True) if base[1] else base
        if node.data == "member_index" and len(node.children) == 2:
            base = path_of(node.children[0])
            if base is None:
                return None
            key = _string_literal(node.children[1])
            return ((*base[0], key), True) if base[1] and key is not None else (base[0], False)
        return None

    def indexes(node: Any) -> list[Any]:
        """The index expressions along a path (``inputs.k`` in ``result.error[inputs.k]``)."""
        out = []
        while isinstance(node, _cel().lark.Tree) and node.data in _PATH_NODES:
            if node.data == "member_index":
                out.append(node.children[1])
            node = node.children[0]
        return out

    def walk(node: Any) -> None:
        lark_mod = _cel().lark
        if not isinstance(node, lark_mod.Tree):
            return
        if node.data in _PATH_NODES:
            found_path = path_of(node)
            if found_path is not None:
                if found_path[0] not in found:
                    found.append(found_path[0])
                for index in reversed(indexes(node)):
                    walk(index)
                return
        for child in node.children:
            walk(child)

    walk(tree)
    return tuple(p for p in found if p[0] in VARIABLES or len(p) > 1)


_PATH_NODES = ("member", "member_dot", "member_index")


def _string_literal(node: Any) -> str | None:
    """The text of a string literal expression (``'class'``), else None."""
    lark_mod = _cel().lark
    while isinstance(node, lark_mod.Tree) and len(node.children) == 1:
        node = node.children[0]
    if isinstance(node, lark_mod.Token) and node.type in ("STRING_LIT", "MLSTRING_LIT"):
        text = str(node)
        raw = text[:1] in ("r", "R")
        text = text[1:] if raw else text
        for quote in ('"""', "'''", '"', "'"):
            if len(text) >= 2 * len(quote) and text.startswith(quote) and text.endswith(quote):
                body = text[len(quote) : -len(quote)]
                # An escape would need decoding: the path ends there instead.
                return body if raw or "\\" not in body else None
    return None


ABSENT = "<absent>"
"""How an explanation shows a path that the activation does not have."""


def read_values(expression: Expression, activation: Mapping[str, Any]) -> dict[str, Any]:
    """Each path the expression reads, dotted, with its value in ``activation``."""
    out: dict[str, Any] = {}
    for path in read_paths(expression.source):
        if path[0] not in activation:
            continue
        node: Any = activation[path[0]]
        for key in path[1:]:
            if isinstance(node, dict) and key in node:
                node = node[key]
            else:
                node = ABSENT
                break
        out[".".join(path)] = node
    return out
