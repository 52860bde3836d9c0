"""Lowering a DAG state's ``dag`` block to a :class:`DagDef`, with the graph's own rules:
a step may not depend on itself (``dag-self-dependency``) or on a step the DAG does not
declare (``dag-unknown-step``), and the dependencies may not form a cycle (``dag-cycle``,
naming a step on it): a cycle would wait forever. :func:`check_gates` refuses a step
whose evidence gate nothing could ever open (``gate-without-evidence``).
"""

from __future__ import annotations

from typing import Protocol

from interlock.core import model
from interlock.core.definition import (
    ActionDef,
    BudgetDef,
    DagDef,
    DagEdge,
    DagStep,
    GateDef,
)
from interlock.core.names import STATE_NAME
from interlock.core.rules import Report
from interlock.core.source import Path
from interlock.core.vocabulary import STEP_ENDED

STEPS_VARIABLE = frozenset({"steps"})
"""What a DAG step's input may read besides the run's values: ``steps.<name>.status``,
``.output`` and ``.error`` of every step of the DAG."""


class DagScope(Protocol):
    """What lowering a DAG needs from the state lowering around it."""

    @property
    def budget(self) -> BudgetDef: ...

    def error(self, path: Path, rule: str, message: str, *, key: bool = False) -> None: ...

    def _action(
        self, path: Path, action: model.Action, extra: frozenset[str] = frozenset()
    ) -> ActionDef: ...


def lower_dag(scope: DagScope, path: Path, spec: model.DagSpec | None) -> DagDef | None:
    """The DAG, its steps ordered so each follows those it depends on; None when absent
    or when its graph is broken (the problems are reported)."""
    if spec is None:
        return None
    if spec.parallelism > scope.budget.max_fan_out:
        scope.error(
            (*path, "parallelism"),
            "budget",
            f"parallelism {spec.parallelism} is above budget.max_fan_out "
            f"({scope.budget.max_fan_out})",
        )
    steps: dict[str, DagStep] = {}
    broken = False
    for name, step in spec.steps.items():
        spath: Path = (*path, "steps", name)
        if not STATE_NAME.match(name):
            scope.error(
                spath,
                "bad-name",
                f"step name {name!r} must start with a letter and hold only letters, "
                "digits, '_' or '-'",
                key=True,
            )
        edges = []
        for j, dep in enumerate(step.depends_on):
            edge = _edge(dep)
            if edge.step == name:
                scope.error(
                    (*spath, "depends_on", j),
                    "dag-self-dependency",
                    (f"step {name!r} depends on itself"),
                )
                broken = True
            elif edge.step not in spec.steps:
                scope.error(
                    (*spath, "depends_on", j),
                    "dag-unknown-step",
                    f"step {name!r} depends on {edge.step!r}, which is not a step of this "
                    f"dag (steps: {', '.join(spec.steps)})",
                )
                broken = True
            else:
                edges.append(edge)
        action = scope._action((*spath, "action"), step.action, STEPS_VARIABLE)
        gate = None
        if step.requires:
            gate = GateDef(step.subject or name, tuple(step.requires.items()))
        steps[name] = DagStep(name, action, tuple(edges), gate)
    if broken:
        return None
    order = _order(steps)
    if order is None:
        on_cycle = _on_cycle(steps)
        scope.error(
            (*path, "steps", on_cycle),
            "dag-cycle",
            f"the dependencies form a cycle through step {on_cycle!r}: it would wait forever",
            key=True,
        )
        return None
    return DagDef(tuple(order), spec.parallelism, spec.completion)


def _edge(dep: str | model.DagEdgeSpec) -> DagEdge:
    if isinstance(dep, str):
        return DagEdge(dep)
    wanted = dep.on if isinstance(dep.on, list) else [dep.on]
    outcomes: set[str] = set()
    for outcome in wanted:
        outcomes |= STEP_ENDED if outcome == "ended" else {outcome}
    return DagEdge(dep.step, frozenset(outcomes))


def _order(steps: dict[str, DagStep]) -> list[DagStep] | None:
    """Declaration order, each step moved after those it depends on (None: a cycle)."""
    placed: dict[str, DagStep] = {}
    remaining = list(steps.values())
    while remaining:
        ready = [s for s in remaining if all(e.step in placed for e in s.depends_on)]
        if not ready:
            return None
        for step in ready:
            placed[step.name] = step
        remaining = [s for s in remaining if s.name not in placed]
    return list(placed.values())


def _on_cycle(steps: dict[str, DagStep]) -> str:
    """A step on a cycle: walking back along dependencies from any step left unordered
    must come back to a step already seen."""
    placed: set[str] = set()
    changed = True
    while changed:
        changed = False
        for step in steps.values():
            if step.name not in placed and all(e.step in placed for e in step.depends_on):
                placed.add(step.name)
                changed = True
    node = next(name for name in steps if name not in placed)
    seen: list[str] = []
    while node not in seen:
        seen.append(node)
        node = next(e.step for e in steps[node].depends_on if e.step not in placed)
    return node


def check_gates(error: Report, spec: model.WorkflowSpec) -> None:
    """A DAG step that requires evidence in a workflow that declares no evidence events
    could never start, and a state gate that reads no evidence from its answers could
    never pass: refused (``gate-without-evidence``)."""
    if spec.evidence is not None:
        return
    for state_name, state in spec.states.items():
        if state.gate is not None and not state.gate.evidence:
            error(
                ("spec", "states", state_name, "gate"),
                "gate-without-evidence",
                f"state {state_name!r} has a gate that reads no evidence (gate.evidence) "
                "and the workflow declares no evidence.events: it could never pass",
            )
        for name, step in (state.dag.steps if state.dag else {}).items():
            if step.requires:
                error(
                    ("spec", "states", state_name, "dag", "steps", name, "requires"),
                    "gate-without-evidence",
                    f"step {name!r} requires evidence but the workflow declares no "
                    "evidence.events: its gate could never open",
                )
