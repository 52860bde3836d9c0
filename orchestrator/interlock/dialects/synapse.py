"""synapse workflow artifacts (plain JSON: a name and steps with ``depends_on``), loaded as
written.

``parse`` checks an artifact with synapse's rules and compiles it as synapse does (the
blackboard task declarations, in dependency order, ``for_each`` expanded); ``summary`` and
``plan`` are synapse's own commands over it (``plan`` its pure planner over a board
snapshot, evidence snapshot and agent pool). :mod:`interlock.dialects.synapse_lower` turns
the same graph into the native state machine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.dialects.base import Checker

DIALECT = "synapse"
PREDICATES = (
    "claim",
    "receipt",
    "tests",
    "policy",
    "approval",
    "sandbox_run",
    "mailbox",
    "dead_letters",
)
OUTCOMES = ("done", "cancelled")
TERMINAL = ("done", "cancelled")
NOT_STARTED = ("open", "pending", "ready", "blocked")
MAX_FAN_OUT = 64
ANYONE = "task"
"""The capability of a step without ``task_class``."""
EVIDENCE = "synapse.evidence"
CAPABILITY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
STATE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


def detect(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and "apiVersion" not in data
        and isinstance(data.get("steps"), list)
        and isinstance(data.get("name"), str)
        and "workfile" not in data
        and all(isinstance(step, dict) and "id" in step for step in data["steps"])
    )


@dataclass(slots=True)
class Edge:
    step: str
    on: str | None  # None: a plain edge
    path: Path


@dataclass(slots=True)
class Step:
    id: str
    title: str
    index: int
    task_class: str | None = None
    description: str | None = None
    depends_on: list[Edge] = field(default_factory=list)
    requires: dict[str, str] = field(default_factory=dict)
    for_each: list[str] | None = None

    @property
    def plain(self) -> bool:
        return not self.requires and all(e.on is None for e in self.depends_on)


@dataclass(slots=True)
class Task:
    """One blackboard task, as ``synapse workflow compile`` declares it."""

    id: str
    title: str
    step: str
    item: str | None
    task_class: str | None
    depends_on: list[tuple[str, str | None]]
    requires: dict[str, str]
    description: str | None = None

    def declaration(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "title": self.title}
        if self.description:
            out["description"] = self.description
        out["depends_on"] = [d for d, _ in self.depends_on]
        conditions = {d: on for d, on in self.depends_on if on}
        if conditions:
            out["conditions"] = conditions
        if self.task_class:
            out["task_class"] = self.task_class
        if self.requires:
            out["requires"] = self.requires
        return out


@dataclass(slots=True)
class Workflow:
    name: str
    steps: list[Step]
    tasks: list[Task]

    def by_step(self, step: str) -> list[Task]:
        return [t for t in self.tasks if t.step == step]


def parse(src: Document, diags: list[Diagnostic]) -> Workflow | None:
    """Check the artifact with synapse's rules; the compiled workflow, or None."""
    check = Checker(src, DIALECT, diags)
    before = len(diags)
    data = src.data
    if not isinstance(data, dict):
        check.error((), "wrong-type", "a workflow must be a JSON object")
        return None
    name = check.string(data, "name", (), required=True, min_len=1)
    raw = data.get("steps")
    if raw is None:
        check.error((), "missing-field", "missing required field 'steps'")
        return None
    items = check.items(raw, ("steps",), "steps")
    if items is None:
        return None
    if not items:
        check.error(("steps",), "invalid-value", "a workflow needs at least one step")
    steps: dict[str, Step] = {}
    for i, item in enumerate(items):
        path: Path = ("steps", i)
        if check.mapping(item, path, "a step") is None:
            continue
        step = _step(check, item, i, path, steps)
        if step is not None:
            steps[step.id] = step
    for step in steps.values():
        for edge in step.depends_on:
            if edge.step == step.id:
                check.error(edge.path, "self-dependency", f"step {step.id!r} depends on itself")
            elif edge.step not in steps:
                check.error(
                    edge.path, "unknown-dependency", f"depends_on names unknown step {edge.step!r}"
                )
    if len(diags) != before or name is None:
        return None
    order = _order(steps)
    if order is None:
        on_cycle = _on_cycle(steps)
        check.error(
            ("steps", steps[on_cycle].index, "depends_on"),
            "cycle",
            f"the dependency graph has a cycle through step {on_cycle!r}",
        )
        return None
    return Workflow(name, order, _tasks(name, order))


def _step(
    check: Checker, item: dict[str, Any], i: int, path: Path, steps: dict[str, Step]
) -> Step | None:
    """One step of the artifact, or None when it cannot be read (or repeats an id)."""
    step_id = check.string(item, "id", path, required=True, min_len=1)
    title = check.string(item, "title", path, required=True)
    task_class = check.string(item, "task_class", path, min_len=1)
    description = check.string(item, "description", path)
    if step_id is None:
        return None
    if step_id in steps:
        check.error((*path, "id"), "duplicate-step", f"duplicate step id {step_id!r}")
        return None
    step = Step(step_id, title or "", i, task_class, description)
    _dependencies(check, item, path, step)
    if "requires" in item:
        _requires(check, item, path, step)
    if "for_each" in item:
        _for_each(check, item, path, step)
    return step


def _dependencies(check: Checker, item: dict[str, Any], path: Path, step: Step) -> None:
    deps = item.get("depends_on") or []
    for j, dep in enumerate(deps if isinstance(deps, list) else []):
        dpath: Path = (*path, "depends_on", j)
        if isinstance(dep, str):
            step.depends_on.append(Edge(dep, None, dpath))
        elif isinstance(dep, dict):
            target = check.string(dep, "step", dpath, required=True, min_len=1)
            on = dep.get("on")
            if on not in OUTCOMES:
                check.error(
                    (*dpath, "on") if "on" in dep else dpath,
                    "invalid-value",
                    "a conditional edge needs on: done or cancelled",
                )
                continue
            if target is not None:
                step.depends_on.append(Edge(target, str(on), dpath))
        else:
            check.error(dpath, "wrong-type", "a dependency is a step id or {step, on}")
    if "depends_on" in item and not isinstance(item["depends_on"], list):
        check.error((*path, "depends_on"), "wrong-type", "depends_on must be a list")


def _requires(check: Checker, item: dict[str, Any], path: Path, step: Step) -> None:
    requires = check.mapping(item["requires"], (*path, "requires"), "requires") or {}
    for key, value in requires.items():
        if key not in PREDICATES:
            check.error(
                (*path, "requires", key),
                "unknown-predicate",
                f"unknown predicate {key!r} (supported: {', '.join(PREDICATES)})",
                key=True,
            )
        elif not isinstance(value, str) or not value:
            check.error((*path, "requires", key), "wrong-type", "a required state is a string")
        else:
            step.requires[key] = value


def _for_each(check: Checker, item: dict[str, Any], path: Path, step: Step) -> None:
    each = check.items(item["for_each"], (*path, "for_each"), "for_each")
    if each is not None:
        if not each:
            check.error((*path, "for_each"), "invalid-value", "for_each is empty")
        if len(each) > MAX_FAN_OUT:
            check.error(
                (*path, "for_each"),
                "fan-out",
                f"a step may fan out to at most {MAX_FAN_OUT} tasks, not {len(each)}",
            )
        values = [v if isinstance(v, str) else json.dumps(v) for v in each]
        if len(set(values)) != len(values):
            check.error((*path, "for_each"), "invalid-value", "for_each repeats an item")
        step.for_each = values


def _order(steps: dict[str, Step]) -> list[Step] | None:
    """Dependency order, file order among the ready ones; None on a cycle."""
    done: set[str] = set()
    out: list[Step] = []
    pending = list(steps.values())
    while pending:
        ready = next((s for s in pending if all(e.step in done for e in s.depends_on)), None)
        if ready is None:
            return None
        pending.remove(ready)
        done.add(ready.id)
        out.append(ready)
    return out


def _on_cycle(steps: dict[str, Step]) -> str:
    state: dict[str, int] = {}

    def visit(node: str) -> str | None:
        state[node] = 1
        for edge in steps[node].depends_on:
            if state.get(edge.step) == 1:
                return edge.step
            if edge.step not in state:
                found = visit(edge.step)
                if found:
                    return found
        state[node] = 2
        return None

    for node in steps:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return next(iter(steps))


def _tasks(name: str, order: list[Step]) -> list[Task]:
    ids: dict[str, list[str]] = {}
    tasks: list[Task] = []
    for step in order:
        deps = [(tid, e.on) for e in step.depends_on for tid in ids[e.step]]
        base = f"{name}/{step.id}"
        if step.for_each is None:
            ids[step.id] = [base]
            tasks.append(
                Task(
                    base,
                    step.title,
                    step.id,
                    None,
                    step.task_class,
                    deps,
                    step.requires,
                    step.description,
                )
            )
            continue
        ids[step.id] = []
        for item in step.for_each:
            tid = f"{base}#{item}"
            ids[step.id].append(tid)
            tasks.append(
                Task(
                    tid,
                    f"{step.title} [{item}]",
                    step.id,
                    item,
                    step.task_class,
                    deps,
                    step.requires,
                    step.description,
                )
            )
    return tasks


# --- compile and plan (synapse's own commands) ----------------------------------------------


def summary(workflow: Workflow) -> str:
    """``synapse workflow compile``'s human summary."""
    lines = [f"{len(workflow.tasks)} blackboard tasks:"]
    for task in workflow.tasks:
        cls = f" [{task.task_class}]" if task.task_class else ""
        deps = ", ".join(d + (f":{on}" if on else "") for d, on in task.depends_on) or "(none)"
        lines.append(f"  {task.id}{cls} <- {deps}")
    return "\n".join(lines)


@dataclass(slots=True)
class Plan:
    done: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    assignments: list[tuple[str, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "state": {
                "done": self.done,
                "in_flight": self.in_flight,
                "ready": self.ready,
                "blocked": self.blocked,
                "skipped": self.skipped,
            },
            "complete": not (self.in_flight or self.ready or self.blocked),
            "assignments": [{"task": t, "agent": a} for t, a in self.assignments],
        }

    def text(self) -> str:
        head = (
            f"state: {len(self.done)} done, {len(self.in_flight)} in flight, "
            f"{len(self.ready)} ready, {len(self.blocked)} blocked"
        )
        if self.skipped:
            head += f", {len(self.skipped)} skipped"
        lines = [head, "assignments:" if self.assignments else "assignments: (none)"]
        lines += [f"  {t} -> {a}" for t, a in self.assignments]
        return "\n".join(lines)


def plan(
    workflow: Workflow,
    status: dict[str, str],
    evidence: dict[str, dict[str, str]] | None = None,
    agents: dict[str, list[str]] | None = None,
    max_in_flight: int = 4,
) -> Plan:
    """What to do next, from a board snapshot: pure and deterministic.

    A task is done when the board says ``done`` or ``cancelled``; skipped when a
    conditional edge can never fire (its dependency ended with the other outcome, or was
    skipped: a retired task is cancelled on the board); ready when every dependency is
    terminal, every conditional edge matches and the evidence proves every predicate;
    blocked otherwise. Any other status the board reports is in flight. Ready tasks go,
    in task order, each to the first free agent (in the pool's order) that advertises its
    ``task_class`` (an unclassified task can go to anyone), one task per agent, never more
    than ``max_in_flight`` in flight with the ones already running."""
    out = Plan()
    outcome: dict[str, str] = {}
    for task in workflow.tasks:
        reported = status.get(task.id)
        if reported in TERMINAL:
            outcome[task.id] = str(reported)
            out.done.append(task.id)
            continue
        if reported is not None and reported not in NOT_STARTED:
            out.in_flight.append(task.id)
            continue
        deps = [(outcome.get(d), on) for d, on in task.depends_on]
        if any(o is not None and on is not None and _effective(o) != on for o, on in deps):
            outcome[task.id] = "skipped"
            out.skipped.append(task.id)
            continue
        proven = all(
            (evidence or {}).get(task.id, {}).get(k) == v for k, v in task.requires.items()
        )
        if all(o is not None for o, _ in deps) and proven:
            out.ready.append(task.id)
        else:
            out.blocked.append(task.id)
    busy: set[str] = set()
    room = max(0, max_in_flight - len(out.in_flight))
    for task_id in out.ready:
        if len(out.assignments) >= room:
            break
        task = next(t for t in workflow.tasks if t.id == task_id)
        for agent, classes in (agents or {}).items():
            if agent in busy:
                continue
            if task.task_class is None or task.task_class in classes:
                out.assignments.append((task_id, agent))
                busy.add(agent)
                break
    return out


def _effective(outcome: str) -> str:
    return "cancelled" if outcome == "skipped" else outcome
