"""The rules over a whole workflow, checked once every state is lowered: each state is
reachable from the initial one, a terminal state is reachable from each, and every
``$.states.<s>.output`` reference names a state that produces an output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from interlock.core import model
from interlock.core.definition import TERMINAL, DeadlineDef, StateDef
from interlock.core.expr import CompiledValue, references
from interlock.core.source import Path


class Report(Protocol):
    """Records one diagnostic: where, the rule it breaks, and what is wrong."""

    def __call__(self, path: Path, rule: str, message: str, *, key: bool = False) -> None: ...


def _edges(spec: model.WorkflowSpec) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, state in spec.states.items():
        targets = {t.goto for t in state.on} | {c.goto for c in state.catch}
        if state.timeout is not None:
            targets.add(state.timeout.goto)
        deadline = spec.deadline
        if deadline is not None and deadline.goto is not None:
            targets.add(deadline.goto)  # taken from whatever state the run is in
        edges[name] = {t for t in targets if t in spec.states}
    return edges


def check_graph(spec: model.WorkflowSpec, error: Report) -> None:
    """Every state reachable from the initial one, and a terminal state reachable from each."""
    states = spec.states
    initial = spec.initial_state
    edges = _edges(spec)
    if initial in states:
        reachable = _reach({initial}, edges)
        for name in states:
            if name not in reachable:
                error(
                    ("spec", "states", name),
                    "unreachable-state",
                    f"state {name!r} cannot be reached from initial state {initial!r}",
                    key=True,
                )
    reverse: dict[str, set[str]] = {name: set() for name in states}
    for source, targets in edges.items():
        for target in targets:
            reverse[target].add(source)
    terminals = {n for n, s in states.items() if s.type == TERMINAL}
    if not terminals:
        error(
            ("spec", "states"),
            "no-terminal-path",
            "the workflow has no terminal state (add one with type: terminal)",
        )
        return
    finishing = _reach(terminals, reverse)
    for name in states:
        if name not in finishing:
            why = "" if edges[name] else " (it has no transitions)"
            error(
                ("spec", "states", name),
                "no-terminal-path",
                f"no terminal state can be reached from state {name!r}{why}",
                key=True,
            )


def check_required(spec: model.WorkflowSpec, error: Report) -> None:
    """No run completes without passing a ``required`` state: with the state taken out of
    the graph, no terminal state that completes the run (one without ``fail``) may be
    reachable from the initial state."""
    states = spec.states
    if spec.initial_state not in states:
        return
    edges = _edges(spec)
    completing = {n for n, s in states.items() if s.type == TERMINAL and s.fail is None}
    for name, state in states.items():
        if not state.required or name == spec.initial_state:
            continue
        around = {k: v - {name} for k, v in edges.items() if k != name}
        bypass = sorted(_reach({spec.initial_state}, around) & completing)
        if bypass:
            error(
                ("spec", "states", name, "required"),
                "required-step-bypass",
                f"state {name!r} is required, but a run can complete in {bypass[0]!r} "
                f"without passing it",
            )


def check_references(
    states: Mapping[str, StateDef], deadline: DeadlineDef | None, error: Report
) -> None:
    """Every ``$.states.<s>.output`` names a state that exists and produces an output."""
    producing = {n for n, s in states.items() if s.produces_output}

    def check(path: Path, value: CompiledValue) -> None:
        for ref in references(value):
            if ref.state not in states:
                error(
                    path,
                    "unknown-state-ref",
                    f"$.states.{ref.state} refers to a state that does not exist",
                )
            elif ref.state not in producing:
                error(
                    path,
                    "no-output-ref",
                    f"$.states.{ref.state}.output refers to a state that produces no "
                    "output (only states with actions, a map or a loop do)",
                )

    for name, state in states.items():
        base: Path = ("spec", "states", name)
        for i, action in enumerate(state.actions):
            check((*base, "actions", i, "input"), action.input)
        for t in state.transitions:
            for key, value in t.set:
                check((*base, "on", t.index, "set", key), value)
        for key, value in state.outputs or ():
            check((*base, "outputs", key), value)
        if state.fail is not None:
            check((*base, "fail", "message"), state.fail.message)
        for i, catch in enumerate(state.catches):
            for key, value in catch.set:
                check((*base, "catch", i, "set", key), value)
        if state.timeout is not None:
            for key, value in state.timeout.set:
                check((*base, "timeout", "set", key), value)
        if state.map is not None:
            if state.map.branches:
                for i, branch in enumerate(state.map.branches):
                    check((*base, "parallel", "actions", i, "input"), branch.input)
            else:
                check((*base, "map", "action", "input"), state.map.action.input)
        if state.loop is not None:
            check((*base, "loop", "action", "input"), state.loop.action.input)
    for key, value in deadline.set if deadline is not None else ():
        check(("spec", "deadline", "set", key), value)


_OWN_OUTCOMES = ("task.completed", "task.failed")


def _unstoppable(spec: model.WorkflowSpec) -> dict[str, list[tuple[str, Path]]]:
    """Per state, the edges the run takes on its own at once, with nothing to stop it going
    round again: an unguarded ``on`` edge keyed by the state's own outcome (a state with
    work), or a ``catch``; neither counting against an edge budget. (A state timeout waits
    its time each round, which a run deadline bounds.)"""
    out: dict[str, list[tuple[str, Path]]] = {}
    for name, state in spec.states.items():
        base: Path = ("spec", "states", name)
        works = bool(state.actions or state.map or state.loop or state.parallel or state.dag)
        edges: list[tuple[str, Path]] = []
        if works:
            for i, t in enumerate(state.on):
                if t.event in _OWN_OUTCOMES and t.guard is None and not t.budget:
                    edges.append((t.goto, (*base, "on", i)))
            for i, c in enumerate(state.catch):
                if not c.budget:
                    edges.append((c.goto, (*base, "catch", i)))
        out[name] = [(goto, path) for goto, path in edges if goto in spec.states]
    return out


def check_cycles(spec: model.WorkflowSpec, error: Report) -> None:
    """A cycle of states the run goes round on its own outcomes alone (no guard, no event
    from outside) could end only by spending the run's whole transition budget: one of its
    edges must count against an edge budget, or the workflow must declare its
    ``budget.max_transitions`` (``unbounded-cycle``, at the edge closing the cycle). Call
    it only for a workflow that declares no run budget."""
    edges = _unstoppable(spec)
    done: set[str] = set()
    for root in spec.states:
        if root in done:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        on_path = {root}
        while stack:
            node, k = stack[-1]
            if k == len(edges[node]):
                stack.pop()
                on_path.discard(node)
                done.add(node)
                continue
            stack[-1] = (node, k + 1)
            goto, path = edges[node][k]
            if goto in on_path:
                error(
                    path,
                    "unbounded-cycle",
                    f"{node!r} -> {goto!r} closes a cycle the run goes round on its own "
                    "outcomes (unguarded, nothing from outside): only the run's transition "
                    "budget would end it: count one of its edges against an edge budget "
                    "(budget: [name], declared in spec.budget.edges), or declare "
                    "budget.max_transitions",
                )
            elif goto not in done:
                stack.append((goto, 0))
                on_path.add(goto)


def _reach(start: set[str], edges: Mapping[str, set[str]]) -> set[str]:
    seen = set(start)
    queue = deque(start)
    while queue:
        for nxt in edges.get(queue.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen
