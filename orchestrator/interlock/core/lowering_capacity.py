"""An AgentDef capability's ``concurrency`` and ``rate``, compiled (see
:mod:`interlock.core.capacity` for what a run does with them). Pure."""

from __future__ import annotations

from interlock.core.definition import BudgetDef
from interlock.core.diagnostics import Diagnostic
from interlock.core.expr import Expression, ExpressionError
from interlock.core.flowmodel import Capability
from interlock.core.limitdef import MAX_KEY_LENGTH, CapacityDef, capacity_names, key_text
from interlock.core.lowering_scope import LoweringScope, parse_duration
from interlock.core.source import Document, Path

INPUT = frozenset({"input"})
"""What a capability's key reads: the action's rendered input, and nothing else."""
MIN_PER_S = 0.001
"""The shortest rate window (a millisecond)."""


def lower_capacity(
    doc: Document, diags: list[Diagnostic], index: int, cap: Capability
) -> tuple[CapacityDef, ...]:
    """The capability's limits (concurrency first, then rate), each problem reported at
    its file, line and column."""
    scope = LoweringScope(doc, diags, None, {}, BudgetDef())
    base: Path = ("spec", "capabilities", index)
    concurrency_name, rate_name = capacity_names(cap.name)
    out: list[CapacityDef] = []
    if cap.concurrency is not None:
        key = _key(scope, (*base, "concurrency", "key"), cap.concurrency.key)
        waiting = cap.concurrency.max_waiting or 0
        out.append(CapacityDef(concurrency_name, cap.concurrency.limit, key, max_waiting=waiting))
    if cap.rate is not None:
        path: Path = (*base, "rate")
        key = _key(scope, (*path, "key"), cap.rate.key)
        per_s = parse_duration(cap.rate.per)
        if per_s is None or per_s < MIN_PER_S:
            diags.append(
                doc.diag(
                    (*path, "per"),
                    "bad-duration",
                    f"rate.per {cap.rate.per!r} is not a duration of at least 1ms "
                    "(a number and a unit: 1s, 1m, 1h)",
                )
            )
            per_s = 1.0
        waiting = cap.rate.max_waiting or 0
        out.append(CapacityDef(rate_name, cap.rate.limit, key, per_s, cap.rate.burst, waiting))
    return tuple(out)


def _key(scope: LoweringScope, path: Path, source: str | None) -> Expression | None:
    if source is None:
        return None
    expression = scope._expression(path, source, INPUT, sees=INPUT)
    reads = sorted(expression.names - INPUT) if expression is not None else []
    if reads:
        scope.error(
            path,
            "capability-key",
            "a capability's limit key sees only 'input' (the action's rendered input); "
            f"it reads {', '.join(repr(n) for n in reads)}",
        )
    if expression is not None and not expression.names:
        # It reads nothing: every request's key, refused here where it failed each one.
        try:
            size = len(key_text(expression.evaluate({})))
        except ExpressionError as exc:
            scope.error(
                path, "capability-key", f"the key reads nothing and cannot be computed: {exc}"
            )
            return expression
        if size > MAX_KEY_LENGTH:
            scope.error(
                path,
                "capability-key",
                f"the key is always {size:,} characters long, not at most {MAX_KEY_LENGTH}: "
                "every request would fail",
            )
    return expression
