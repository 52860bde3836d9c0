"""A synapse workflow lowered to the native state machine:

- the workflow is one ``dag`` state: each compiled task a step that starts as soon as its
  dependencies have ended as its edges ask, as the board's ready/blocked derivation does
  (a plain edge is satisfied by any end, so a cancelled task does not stop the steps
  after it; ``completion: all_settled``);
- a conditional edge is an edge on an outcome (``done``: completed; ``cancelled``: failed
  or skipped); a branch that can never fire is *skipped*, which counts as ``cancelled``
  for the steps after it, as a retired task does on the board;
- ``requires`` is the step's evidence gate: a ``synapse.evidence`` event's data is the
  evidence snapshot by compiled task id, kept whenever it arrives, and the step starts
  once it proves every predicate for its task;
- the run's outputs are synapse's run result: ``complete``, ``state``, every task's
  status, ``interrupted`` (always empty: no operation is left half-done) and
  ``assignments`` (who answered each task done: its answer's ``source``), from the
  DAG's result.

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
    Workflow,
    parse,
)


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    workflow = parse(src, diags)
    if workflow is None:
        return None
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
        if task.requires:
            entry["requires"] = dict(task.requires)
            entry["subject"] = task.id
            out.at((*spath, "requires"), ("steps", step.index, "requires"))
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
        TIMED_OUT: {"type": "terminal", "outputs": _timed_out_result(workflow, names)},
    }
    out.note(
        (*base, "dag"),
        "a plain depends_on waits for any end of the step (on: ended); {on: done} is on: "
        "completed and {on: cancelled} on: [failed, skipped] (a retired task counts as "
        "cancelled); completion all_settled: a cancelled task never stops the others",
    )
    spec: dict[str, Any] = {
        "deadline": {"goto": TIMED_OUT, "set": {"board": "{{ steps }}"}},
        "initial_state": DAG_STATE,
        "states": states,
    }
    out.note(
        ("spec", "deadline"),
        "synapse run --deadline D is interlock start --deadline D: when it passes, the run "
        "ends complete: false, timed_out: true, with the board as it stood (the steps in "
        "flight are cancelled and listed as interrupted); --deadline 0 asks for nothing",
    )
    if any(task.requires for task in workflow.tasks):
        spec["evidence"] = {"events": [EVIDENCE]}
        out.note(
            ("spec", "evidence"),
            f"requires -> an evidence gate: a {EVIDENCE} event's data is the evidence "
            "snapshot by task id (as synapse's evidence file); it is kept whenever it "
            "arrives, and a step starts once the evidence proves every predicate for its "
            "task (its subject)",
        )
    return _finish(src, workflow, lowered, out, spec, capabilities)


TIMED_OUT = "timed_out"
"""The end of a run whose deadline passed (``interlock start --deadline``)."""


def _timed_out_result(workflow: Workflow, names: dict[str, str]) -> dict[str, Any]:
    """synapse's run result when its deadline passed: the board as it stood (``null``
    when nothing was started: ``--deadline 0``), every task's status on it (``done``,
    ``cancelled``, ``in_progress`` for those cancelled in flight, ``open`` for those
    never started), and those in flight as ``interrupted``."""
    board = "context.board"
    seed = (
        '{"completed": "done", "failed": "cancelled", "skipped": "cancelled", '
        '"running": "in_progress", "held": "open", "pending": "open"}'
    )
    status = {
        t.id: f'({_str(names[t.id])} in {board} ? {board}[{_str(names[t.id])}].status : "pending")'
        for t in workflow.tasks
    }
    listed = ", ".join(status.values())
    ended = '["completed", "failed"]'
    step = {t.id: f"{board}[{_str(names[t.id])}]" for t in workflow.tasks}
    assigned = [
        f'{{"task": {_str(tid)}, "agent": ({_str(names[tid])} in {board} && "source" in {s}) '
        f'? {s}.source : ""}}'
        for tid, s in step.items()
    ]
    running = [f'{{"task": {_str(tid)}, "status": {s}}}' for tid, s in status.items()]
    return {
        "complete": False,
        "timed_out": True,
        "state": "{{ size("
        + board
        + ") == 0 ? null : {"
        + f'"done": [{listed}].filter(s, s in {ended}).size(), '
        + f'"skipped": [{listed}].filter(s, s == "skipped").size()'
        + "} }}",
        "tasks": {tid: "{{ " + seed + "[" + s + "] }}" for tid, s in status.items()},
        "interrupted": "{{ ["
        + ", ".join(running)
        + '].filter(t, t.status == "running").map(t, t.task) }}',
        "assignments": "{{ [" + ", ".join(assigned) + '].filter(a, a.agent != "") }}',
    }


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
    """synapse's run result from the DAG's: each task ``done`` or ``cancelled``, its board
    status (a step retired by a conditional edge is cancelled on the board); ``state``
    counts the retired ones apart, as the planner does (``skipped``)."""
    status = {
        t.id: f"states.{DAG_STATE}.output[{_str(names[t.id])}].status" for t in workflow.tasks
    }
    seed = '{"completed": "done", "failed": "cancelled", "skipped": "cancelled"}'
    step = {t.id: f"states.{DAG_STATE}.output[{_str(names[t.id])}]" for t in workflow.tasks}
    # Who answered each task that ended done (the answer's source), in task order.
    assigned = [
        f'{{"task": {_str(tid)}, "agent": "source" in {s} ? {s}.source : ""}}'
        for tid, s in step.items()
    ]
    listed = ", ".join(status.values())
    return {
        "complete": True,
        "timed_out": False,
        "state": {
            "done": "{{ [" + listed + '].filter(s, s != "skipped").size() }}',
            "skipped": "{{ [" + listed + '].filter(s, s == "skipped").size() }}',
        },
        "tasks": {tid: "{{ " + seed + "[" + s + "] }}" for tid, s in status.items()},
        "interrupted": [],
        "assignments": "{{ [" + ", ".join(assigned) + '].filter(a, a.agent != "") }}',
    }


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


def _str(text: str) -> str:
    return json.dumps(text)
