"""A synapse workflow lowered to the native state machine:

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
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.dialects.base import API_VERSION, Lowered, Lowering, agent_def
from interlock.dialects.synapse import (
    ANYONE,
    CAPABILITY,
    DIALECT,
    EVIDENCE,
    Step,
    Task,
    Workflow,
    parse,
)


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    workflow = parse(src, diags)
    if workflow is None:
        return None
    if any(step.requires for step in workflow.steps):
        return _lower_staged(src, workflow)
    return _lower_dag(src, workflow)


DAG_STATE = "run"


def _lower_dag(src: Document, workflow: Workflow) -> Lowered:
    """The workflow as one DAG state: each compiled task a step that starts as soon as its
    dependencies have ended as its edges ask, as the board's ready/blocked derivation does."""
    lowered = Lowered(DIALECT, src, extra={"workflow": workflow})
    out = Lowering(src, DIALECT)
    names = _step_names(workflow)
    base: Path = ("spec", "states", DAG_STATE)
    out.at(base, ("steps",))
    steps: dict[str, Any] = {}
    capabilities: list[str] = []
    for task in workflow.tasks:
        step = next(s for s in workflow.steps if s.id == task.step)
        name = names[task.id]
        spath: Path = (*base, "dag", "steps", name)
        out.at(spath, ("steps", step.index))
        capability = _capability(task.task_class)
        if capability not in capabilities:
            capabilities.append(capability)
        action_input: dict[str, Any] = {"task": task.id, "title": task.title}
        if task.description:
            action_input["description"] = task.description
        if task.item is not None:
            action_input["item"] = task.item
        entry: dict[str, Any] = {"action": {"capability": capability, "input": action_input}}
        if task.depends_on:
            entry["depends_on"] = [_dag_edge(names[d], on) for d, on in task.depends_on]
            by_step = {e.step: e.path for e in step.depends_on}
            for j, (dep, _) in enumerate(task.depends_on):
                dep_step = next(x.step for x in workflow.tasks if x.id == dep)
                out.at((*spath, "depends_on", j), by_step.get(dep_step, ("steps", step.index)))
        steps[name] = entry
        if task.task_class is None:
            out.note(
                spath, f"{task.id} has no task_class (it can go to anyone): capability {ANYONE}"
            )
        elif capability != task.task_class:
            out.note(spath, f"task_class {task.task_class!r} -> capability {capability}")
    parallelism = min(len(steps), 64)
    states: dict[str, Any] = {
        DAG_STATE: {
            "description": workflow.name,
            "dag": {"parallelism": parallelism, "completion": "all_settled", "steps": steps},
            "on": [{"event": "task.completed", "goto": "complete"}],
        },
        "complete": {"type": "terminal", "outputs": _dag_result(workflow, names)},
    }
    out.note(
        (*base, "dag"),
        "a plain depends_on waits for any end of the step (on: ended); {on: done} is on: "
        "completed and {on: cancelled} on: [failed, skipped] (a retired task counts as "
        "cancelled); completion all_settled: a cancelled task never stops the others",
    )
    spec: dict[str, Any] = {"initial_state": DAG_STATE, "states": states}
    return _finish(src, workflow, lowered, out, spec, capabilities)


def _dag_edge(step: str, on: str | None) -> Any:
    if on is None:
        return {"step": step, "on": "ended"}
    if on == "done":
        return step
    return {"step": step, "on": ["failed", "skipped"]}


def _step_names(workflow: Workflow) -> dict[str, str]:
    """A DAG step name for each task id (``release/build`` -> ``build``,
    ``ingest/shard#us`` -> ``shard-us``), unique and a valid name."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for task in workflow.tasks:
        raw = task.step if task.item is None else f"{task.step}-{task.item}"
        name = re.sub(r"[^A-Za-z0-9_-]+", "_", raw)
        if not name or not name[0].isalpha():
            name = "s_" + name
        name = name[:60]
        base, n = name, 2
        while name in taken:
            name = f"{base}_{n}"
            n += 1
        taken.add(name)
        names[task.id] = name
    return names


def _dag_result(workflow: Workflow, names: dict[str, str]) -> dict[str, Any]:
    """synapse's run result from the DAG's: each task done, cancelled or skipped."""
    status = {
        t.id: f"states.{DAG_STATE}.output[{_str(names[t.id])}].status" for t in workflow.tasks
    }
    seed = '{"completed": "done", "failed": "cancelled", "skipped": "skipped"}'
    listed = ", ".join(status.values())
    return {
        "complete": True,
        "timed_out": False,
        "state": {
            "done": "{{ [" + listed + '].filter(s, s != "skipped").size() }}',
            "skipped": "{{ [" + listed + '].filter(s, s == "skipped").size() }}',
        },
        "tasks": {tid: "{{ " + seed + "[" + s + "] }}" for tid, s in status.items()},
    }


def _lower_staged(src: Document, workflow: Workflow) -> Lowered:
    """A workflow with evidence requirements: stages, each step with ``requires`` behind a
    state that waits for the evidence."""
    lowered = Lowered(DIALECT, src, extra={"workflow": workflow})
    out = Lowering(src, DIALECT)
    stages = _stages(workflow)
    names = _state_names(stages)
    states: dict[str, Any] = {}
    capabilities: list[str] = []
    for k in range(len(stages)):
        _stage(out, workflow, stages, names, k, states, capabilities)
    states["complete"] = {"type": "terminal", "outputs": _result(workflow)}
    entry = _entry(workflow, stages, names, 0)
    initial = "start" if entry is None else entry
    if entry is None:
        # The first stage is conditional on nothing run yet: impossible (its
        # dependencies come first), so entry is always a stage; kept for safety.
        initial = names[0]
    out.at(("spec", "initial_state"), ("steps",))
    spec: dict[str, Any] = {
        "context": {t.id: "pending" for t in workflow.tasks},
        "initial_state": initial,
        "states": states,
    }
    fan = max(len(s) for s in (_stage_tasks(workflow, st) for st in stages))
    if fan > 64:
        spec["budget"] = {"max_fan_out": fan}
    out.note(
        ("spec", "context"),
        "each task's status, by compiled task id: pending, then done, cancelled or skipped "
        "(a branch not taken)",
    )
    return _finish(src, workflow, lowered, out, spec, capabilities)


def _finish(
    src: Document,
    workflow: Workflow,
    lowered: Lowered,
    out: Lowering,
    spec: dict[str, Any],
    capabilities: list[str],
) -> Lowered:
    """The native workflow around ``spec``, and the AgentDef its task classes imply."""
    name = re.sub(r"[^a-z0-9-]+", "-", workflow.name.lower()).strip("-")[:63].strip("-") or "wf"
    if name != workflow.name:
        out.note(("metadata", "name"), f"name {workflow.name!r} -> {name} (a DNS label)")
    out.at(("metadata", "name"), ("name",))
    native = {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {"name": name, "annotations": {"synapse.name": workflow.name}},
        "spec": spec,
    }
    lowered.workflows.append(out.finish(native, lowered))
    lowered.agents.append(_agents(src, lowered, name, capabilities))
    return lowered


def _stage(
    out: Lowering,
    workflow: Workflow,
    stages: list[list[Step]],
    names: list[str],
    k: int,
    states: dict[str, Any],
    capabilities: list[str],
) -> None:
    """The state of stage ``k`` (and the evidence gate before it, when it has one)."""
    stage = stages[k]
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
        _evidence_gate(out, stage[0], tasks, name, names, states)


def _evidence_gate(
    out: Lowering,
    step: Step,
    tasks: list[Task],
    name: str,
    names: list[str],
    states: dict[str, Any],
) -> None:
    """A wait before ``name`` for an evidence snapshot that proves the step's predicates."""
    step_path: Path = ("steps", step.index)
    gate = _gate_name(name, names)
    out.at(("spec", "states", gate), (*step_path, "requires"))
    states[gate] = {
        "description": f"hold {step.id} until the evidence proves "
        + ", ".join(f"{k}={v}" for k, v in step.requires.items()),
        "on": [
            {
                "event": EVIDENCE,
                "guard": _proof(tasks, step.requires),
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


def _agents(src: Document, lowered: Lowered, name: str, capabilities: list[str]) -> Document:
    """The AgentDef the task classes imply."""
    agent = Lowering(src, DIALECT)
    agent.note(
        ("metadata",),
        f"implied by the task classes; {ANYONE} is the capability of unclassified steps",
    )
    return agent.finish(
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
