"""synapse workflow artifacts (plain JSON: a name and steps with ``depends_on``), loaded as
written.

``compile_tasks`` is synapse's own compilation (the blackboard task declarations, in
dependency order, ``for_each`` expanded) and ``plan`` its pure planner over a board
snapshot, evidence snapshot and agent pool. ``lower`` turns the same graph into the native
state machine:

- steps run in dependency order, in *stages*: steps whose dependencies are all plain and
  that need no evidence, and that do not depend on each other, run together in a
  ``parallel`` state (``completion: all_settled``, so a cancelled step does not stop its
  siblings, as a plain edge is satisfied by any terminal status); a ``for_each`` step's
  tasks run together the same way;
- a step with conditional edges runs only when the recorded outcomes match (guards on the
  transitions into it); otherwise it is *skipped*, which counts as ``cancelled`` for the
  steps after it, as a retired task does on the board;
- a step with ``requires`` waits, before it runs, for a ``synapse.evidence`` event whose
  data (the evidence snapshot, by compiled task id) proves every predicate;
- each task's status (``done``, ``cancelled``, ``skipped``) is kept in the context under
  its task id, and the run's outputs are synapse's run result: ``complete``, ``state``
  and every task's status.

The routing hint ``task_class`` is the action's capability; a step without one asks for
the capability ``task`` ("can go to anyone": every synapse worker serves it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.dialects.base import API_VERSION, Checker, Lowered, Lowering, agent_def

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
        step_id = check.string(item, "id", path, required=True, min_len=1)
        title = check.string(item, "title", path, required=True)
        task_class = check.string(item, "task_class", path, min_len=1)
        description = check.string(item, "description", path)
        if step_id is None:
            continue
        if step_id in steps:
            check.error((*path, "id"), "duplicate-step", f"duplicate step id {step_id!r}")
            continue
        step = Step(step_id, title or "", i, task_class, description)
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
        if "requires" in item:
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
                    check.error(
                        (*path, "requires", key), "wrong-type", "a required state is a string"
                    )
                else:
                    step.requires[key] = value
        if "for_each" in item:
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
        steps[step_id] = step
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


# --- lowering -------------------------------------------------------------------------------


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    workflow = parse(src, diags)
    if workflow is None:
        return None
    lowered = Lowered(DIALECT, src, extra={"workflow": workflow})
    out = Lowering(src, DIALECT)
    stages = _stages(workflow)
    names = _state_names(stages)
    states: dict[str, Any] = {}
    capabilities: list[str] = []
    for k, stage in enumerate(stages):
        name = names[k]
        step_path: Path = ("steps", stage[0].index)
        base: Path = ("spec", "states", name)
        out.at(base, step_path)
        tasks = [t for s in stage for t in workflow.by_step(s.id)]
        actions = []
        for task in tasks:
            step = next(s for s in stage if s.id == task.step)
            capability = _capability(task.task_class)
            if capability not in capabilities:
                capabilities.append(capability)
            action_input: dict[str, Any] = {"task": task.id, "title": task.title}
            if task.description:
                action_input["description"] = task.description
            if task.item is not None:
                action_input["item"] = task.item
            actions.append({"capability": capability, "input": action_input})
            if task.task_class is None:
                out.note(
                    (*base, "actions" if len(tasks) == 1 else "parallel"),
                    f"{step.id} has no task_class (it can go to anyone): capability {ANYONE}",
                )
            elif capability != task.task_class:
                out.note(base, f"task_class {task.task_class!r} -> capability {capability}")
        state: dict[str, Any] = {"description": " / ".join(s.title for s in stage)}
        if len(actions) == 1:
            state["actions"] = actions
            state["on"] = [
                *_route(workflow, stages, names, k, {tasks[0].id: '"done"'}, "task.completed"),
                *_route(workflow, stages, names, k, {tasks[0].id: '"cancelled"'}, "task.failed"),
            ]
        else:
            state["parallel"] = {"completion": "all_settled", "actions": actions}
            outcome = {
                t.id: f'(result[{i}].status == "completed" ? "done" : "cancelled")'
                for i, t in enumerate(tasks)
            }
            state["on"] = _route(workflow, stages, names, k, outcome, "task.completed")
            out.note(
                (*base, "parallel"),
                "these steps' dependencies are met together: they run at once and the next "
                "stage starts when all have ended (done or cancelled)",
            )
        states[name] = state
        if stage[0].requires:
            gate = _gate_name(name, names)
            out.at(("spec", "states", gate), (*step_path, "requires"))
            states[gate] = {
                "description": f"hold {stage[0].id} until the evidence proves "
                + ", ".join(f"{k}={v}" for k, v in stage[0].requires.items()),
                "on": [
                    {
                        "event": EVIDENCE,
                        "guard": _proof(tasks, stage[0].requires),
                        "goto": name,
                        "set": {"evidence": "{{ data }}"},
                    }
                ],
            }
            out.note(
                ("spec", "states", gate),
                f"requires -> a wait for a {EVIDENCE} event whose data (the evidence "
                "snapshot, by task id) proves every predicate; a snapshot that does not "
                "leaves the run waiting",
            )
    states["complete"] = {"type": "terminal", "outputs": _result(workflow)}
    entry = _entry(workflow, stages, names, 0)
    initial = "start" if entry is None else entry
    if entry is None:
        # The first stage is conditional on nothing run yet: impossible (its
        # dependencies come first), so entry is always a stage; kept for safety.
        initial = names[0]
    out.at(("spec", "initial_state"), ("steps",))
    name = re.sub(r"[^a-z0-9-]+", "-", workflow.name.lower()).strip("-")[:63].strip("-") or "wf"
    if name != workflow.name:
        out.note(("metadata", "name"), f"name {workflow.name!r} -> {name} (a DNS label)")
    out.at(("metadata", "name"), ("name",))
    spec: dict[str, Any] = {
        "context": {t.id: "pending" for t in workflow.tasks},
        "initial_state": initial,
        "states": states,
    }
    fan = max(len(s) for s in (_stage_tasks(workflow, st) for st in stages))
    if fan > 64:
        spec["budget"] = {"max_fan_out": fan}
    native = {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {"name": name, "annotations": {"synapse.name": workflow.name}},
        "spec": spec,
    }
    out.note(
        ("spec", "context"),
        "each task's status, by compiled task id: pending, then done, cancelled or skipped "
        "(a branch not taken)",
    )
    lowered.workflows.append(out.finish(native, lowered))
    agent = Lowering(src, DIALECT)
    agent.note(
        ("metadata",),
        f"implied by the task classes; {ANYONE} is the capability of unclassified steps",
    )
    lowered.agents.append(
        agent.finish(
            agent_def(
                f"{name}-agents"[:63].strip("-"),
                (
                    (
                        c,
                        "any synapse task without a class"
                        if c == ANYONE
                        else f"synapse task_class {c}",
                    )
                    for c in capabilities
                ),
            ),
            lowered,
        )
    )
    return lowered


def _capability(task_class: str | None) -> str:
    if task_class is None:
        return ANYONE
    if CAPABILITY.match(task_class):
        return task_class
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", task_class).strip(".-") or ANYONE


def _stage_tasks(workflow: Workflow, stage: list[Step]) -> list[Task]:
    return [t for s in stage for t in workflow.by_step(s.id)]


def _stages(workflow: Workflow) -> list[list[Step]]:
    """Steps in dependency order, grouped: plain steps that do not depend on each other run
    together; a step with a conditional edge or evidence runs on its own."""
    stages: list[list[Step]] = []
    for step in workflow.steps:
        current = stages[-1] if stages else None
        if (
            current is not None
            and step.plain
            and all(s.plain for s in current)
            and not any(e.step in {s.id for s in current} for e in step.depends_on)
        ):
            current.append(step)
        else:
            stages.append([step])
    return stages


def _state_names(stages: list[list[Step]]) -> list[str]:
    names: list[str] = []
    taken = {"complete"}
    for stage in stages:
        raw = "_".join(s.id for s in stage)
        name = re.sub(r"[^A-Za-z0-9_-]+", "_", raw)
        if not name or not name[0].isalpha():
            name = "s_" + name
        name = name[:56]
        base, n = name, 2
        while name in taken or f"{name}-evidence" in taken:
            name = f"{base}_{n}"
            n += 1
        taken.add(name)
        names.append(name)
    return names


def _gate_name(name: str, names: list[str]) -> str:
    return f"{name}-evidence"


def _str(text: str) -> str:
    return json.dumps(text)


def _proof(tasks: list[Task], requires: dict[str, str]) -> str:
    clauses = []
    for task in tasks:
        tid = _str(task.id)
        clauses.append(f"{tid} in data")
        for key, value in requires.items():
            clauses.append(f"{_str(key)} in data[{tid}]")
            clauses.append(f"data[{tid}][{_str(key)}] == {_str(value)}")
    return " && ".join(clauses)


def _entry(workflow: Workflow, stages: list[list[Step]], names: list[str], k: int) -> str | None:
    """The first stage runs at once: its steps depend on nothing."""
    return names[k] + ("-evidence" if stages[k][0].requires else "")


def _route(
    workflow: Workflow,
    stages: list[list[Step]],
    names: list[str],
    k: int,
    outcome: dict[str, str],
    event: str,
) -> list[dict[str, Any]]:
    """Transitions out of stage ``k`` on ``event``: to the first later stage that runs.

    ``outcome`` gives each of stage k's tasks' status as CEL (a constant, or read from the
    parallel result). A later stage with conditional edges runs when they match (skipped
    stages in between count as cancelled); otherwise it is skipped and the next considered.
    """
    known: dict[str, str] = dict(outcome)
    edges: list[dict[str, Any]] = []
    skipped: list[str] = []
    for j in range(k + 1, len(stages)):
        stage = stages[j]
        target = names[j] + ("-evidence" if stage[0].requires else "")
        guard = _condition(workflow, stage, known)
        writes = _writes(outcome, skipped)
        edge: dict[str, Any] = {"event": event, "goto": target, "set": writes}
        if guard == "true":
            edges.append(edge)
            return edges
        if guard != "false":
            edges.append({"event": event, "guard": guard, "goto": target, "set": writes})
        for task in _stage_tasks(workflow, stage):
            known[task.id] = '"skipped"'
            skipped.append(task.id)
    edges.append({"event": event, "goto": "complete", "set": _writes(outcome, skipped)})
    return edges


def _writes(outcome: dict[str, str], skipped: list[str]) -> dict[str, Any]:
    """The statuses a transition records: the stage's outcome, and the stages it skips."""
    writes: dict[str, Any] = {
        t: json.loads(v) if v.startswith('"') else "{{ " + v + " }}" for t, v in outcome.items()
    }
    writes.update(dict.fromkeys(skipped, "skipped"))
    return writes


def _condition(workflow: Workflow, stage: list[Step], known: dict[str, str]) -> str:
    """CEL that holds when every conditional edge of the stage's step matches."""
    clauses: list[str] = []
    step = stage[0]
    for edge in step.depends_on:
        if edge.on is None:
            continue
        for task in workflow.by_step(edge.step):
            status = known.get(task.id, f"context[{_str(task.id)}]")
            accepted = ['"done"'] if edge.on == "done" else ['"cancelled"', '"skipped"']
            if status.startswith('"'):
                if status in accepted:
                    continue
                return "false"
            clauses.append(f"{status} in [{', '.join(accepted)}]")
    return " && ".join(clauses) if clauses else "true"


def _result(workflow: Workflow) -> dict[str, Any]:
    """synapse's run result: complete, timed_out, the board state, each task's status."""
    ids = ", ".join(f"context[{_str(t.id)}]" for t in workflow.tasks)
    return {
        "complete": True,
        "timed_out": False,
        "state": {
            "done": "{{ [" + ids + '].filter(s, s == "done" || s == "cancelled").size() }}',
            "skipped": "{{ [" + ids + '].filter(s, s == "skipped").size() }}',
        },
        "tasks": {t.id: "{{ context[" + _str(t.id) + "] }}" for t in workflow.tasks},
    }
