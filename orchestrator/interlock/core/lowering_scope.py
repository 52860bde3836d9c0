"""What lowering every part of a workflow shares.

A :class:`LoweringScope` holds the document being lowered, the problems found so far, the
state names and budget the workflow declares and the capabilities the AgentDefs declare. It
compiles the pieces every part uses (CEL expressions, values, durations, ``set`` maps) and
reports each problem at its file, line and column. :mod:`interlock.core.lowering_states`
lowers states on it, :mod:`interlock.core.lowering` the workflow around them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from interlock.core import model
from interlock.core.definition import BudgetDef
from interlock.core.diagnostics import Diagnostic
from interlock.core.expr import (
    CelTypeError,
    CompiledValue,
    CompileError,
    CostError,
    Expression,
    ValueProblem,
    compile_value,
)
from interlock.core.source import Document, Path, Span, position_in, written_offset

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float | None:
    """Seconds in ``30s``, ``30m``, ``1h``, ``1h30m``, ``250ms``; None when malformed."""
    if not isinstance(text, str) or not _DURATION.match(text.strip()):
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


class LoweringScope:
    """One document being lowered: where its problems go and how its pieces compile."""

    def __init__(
        self,
        doc: Document,
        diags: list[Diagnostic],
        capabilities: set[str] | None,
        states: Mapping[str, model.State],
        budget: BudgetDef,
    ) -> None:
        self.doc = doc
        self.diags = diags
        self.capabilities = capabilities
        self.states = states
        self.budget = budget
        spec = doc.data.get("spec") if isinstance(doc.data, dict) else None
        self.doubles = isinstance(spec, dict) and spec.get("numbers") == "double"
        """``spec.numbers: double``: every expression reads JSON numbers as doubles."""

    def error(self, path: Path, rule: str, message: str, *, key: bool = False) -> None:
        self.diags.append(self.doc.diag(path, rule, message, key=key))

    def _expression(
        self,
        path: Path,
        source: str,
        extra: frozenset[str] = frozenset(),
        sees: frozenset[str] | None = None,
    ) -> Expression | None:
        """``sees``: what it may read where it stands, named when it reads an unknown name."""
        try:
            return Expression(source, extra, doubles=self.doubles, sees=sees)
        except CompileError as exc:
            self._cel_error(path, exc, text=source, whole=True)
            return None

    def _value(self, path: Path, value: Any, extra: frozenset[str] = frozenset()) -> CompiledValue:
        problems: list[ValueProblem] = []
        compiled = compile_value(value, extra, path, problems, doubles=self.doubles)
        for problem in problems:
            text = value
            for key in problem.path[len(path) :]:
                text = text[key]
            self._cel_error(problem.path, problem.error, problem.offset, text)
        return compiled

    def _cel_error(
        self,
        path: Path,
        error: CompileError,
        offset: int = 0,
        text: str = "",
        *,
        whole: bool = False,
    ) -> None:
        """``error`` of the expression at ``offset`` of ``text``, the string at ``path``
        (``whole``: the string is the expression, a guard's, however it is written)."""
        span = self.doc.where(path)
        if whole:
            lines = text.split("\n")
            at = sum(len(written) + 1 for written in lines[: error.line - 1]) + error.col - 1
            line, col = position_in(span, text, min(max(at, 0), len(text)))
        else:
            found = _block_position(span, text, offset, error.line, error.col)
            line, col = found or _inner_position(span, error.line, error.col + offset)
        if isinstance(error, CostError):
            self.diags.append(Diagnostic(self.doc.path, line, col, "cel-cost", error.message))
        elif isinstance(error, CelTypeError):
            self.diags.append(Diagnostic(self.doc.path, line, col, "cel-type", error.message))
        else:
            self.diags.append(Diagnostic(self.doc.path, line, col, "cel-compile", error.message))

    def _duration(self, path: Path, text: str | None) -> float | None:
        if text is None:
            return None
        seconds = parse_duration(text)
        if seconds is None or seconds <= 0:
            self.error(
                path,
                "bad-duration",
                f"{text!r} is not a duration (a number and a unit: 250ms, 30s, 30m, 1h, 1d)",
            )
        return seconds

    def _goto(self, path: Path, goto: str) -> None:
        if goto not in self.states:
            self.error(
                path,
                "unknown-goto",
                f"goto {goto!r} is not a state (states: {', '.join(self.states)})",
            )

    def _sets(self, path: Path, values: Mapping[str, Any]) -> tuple[tuple[str, CompiledValue], ...]:
        return tuple((k, self._value((*path, k), v)) for k, v in values.items())


def _inner_position(span: Span, line: int, col: int) -> tuple[int, int]:
    """Position in the file of (line, col) inside a scalar that starts at ``span``."""
    if span.style in ("|", ">"):
        return span.line + line, (span.content_col or span.col + 1) + col - 1
    if span.raw is not None:
        return span.line, span.col + 1 + written_offset(span.raw, span.style, line, col)
    if line > 1:
        return span.line + line - 1, col
    lead = 1 if span.style in ("'", '"') else 0
    return span.line, span.col + lead + col - 1


def _block_position(
    span: Span, text: str, offset: int, line: int, col: int
) -> tuple[int, int] | None:
    """Position in the file of (line, col) of the expression at ``offset`` of ``text``, a
    block scalar's value, found where its template is written among the scalar's lines
    (a folded ``>`` scalar's value is not its lines: search them). None: not a block
    scalar, or a template's first line written across lines of a folded one."""
    if span.style not in ("|", ">") or span.raw is None:
        return None
    start, end = text.rfind("{{", 0, offset), text.find("}}", offset)
    if start < 0 or end < 0:
        return None
    written = text[start : end + 2].split("\n", 1)[0]  # its first line
    at = -1
    for _ in range(text.count(written, 0, start) + 1):
        at = span.raw.find(written, at + 1)
        if at < 0:
            return None
    at += offset - start
    before = span.raw[:at]
    first = span.line + 1 + before.count("\n")
    if line > 1:  # an expression written across lines, wrong on a later one
        return first + line - 1, span.content_col + col - 1
    return first, at - before.rfind("\n") + col - 1
