"""kxm Runtime workflows (``schema: kxm.workflow.v1``), loaded as written.

Steps connected by typed transitions become states: an ``agent`` step asks its agent for
one of the step's declared outcome keys (anything else is ``failed``); ``moa`` asks several
agents at once and joins them (``all``, ``all-settled``, ``quorum``, ``first-success``);
``gate`` asks the gate runner to run a gate and derives the outcome from ``expect``;
``approval`` waits for a ``kxm.approval`` event and ``wait`` for a ``kxm.signal``; ``$terminal``
ends the run with its ``terminalStatus``. Back-edges count against their own and the
workflow's ``maxTransitions``, ``maxRunDurationMs`` is the run's deadline, and
``maxModelCost`` is a budget summed from the ``cost`` each agent reports.

The Runtime's load-time rules are checked with rule ids ``kxm.<rule>`` (``kxm.gate-outcome-
impossible``, ``kxm.gate-outcome-renamed``, ``kxm.back-edge-budget``...).
"""

from __future__ import annotations

import json
import re
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.dialects.base import API_VERSION, Checker, Lowered, Lowering, agent_def

DIALECT = "kxm"
SCHEMA = "kxm.workflow.v1"
TERMINAL = "$terminal"
KINDS = ("agent", "moa", "gate", "approval", "wait", "workflow")
JOINS = ("all", "all-settled", "quorum", "first-success")
STATUSES = ("completed", "failed", "cancelled")
GATE_OUTCOMES = {"pass": ("passed", "implementation-failure"), "fail": ("passed", "repro-missing")}
TOP_KEYS = {
    "schema",
    "description",
    "coordinator",
    "limits",
    "planHash",
    "reproOracle",
    "requirePlanHash",
    "steps",
}
STEP_KEYS = {
    "id",
    "kind",
    "description",
    "prompt",
    "agent",
    "agents",
    "assignments",
    "join",
    "quorum",
    "gate",
    "expect",
    "timeoutMs",
    "requiredEvidence",
    "signalKey",
    "on",
}
LIMIT_KEYS = {
    "maxTransitions",
    "maxRunDurationMs",
    "maxAgentTimeMs",
    "maxModelCost",
    "currency",
}


def detect(data: Any) -> bool:
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def _q(text: str) -> str:
    return json.dumps(text)


def _ctx(key: str) -> str:
    return f"context[{_q(key)}]"


def _capability(name: str) -> str:
    return "kxm." + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "agent")


def _state(step_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", step_id)
    return name if name[:1].isalpha() else f"s_{name}"


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    check = Checker(src, DIALECT, diags)
    before = len(diags)
    data = src.data
    if not isinstance(data, dict):
        check.error((), "wrong-type", "a Runtime workflow must be a mapping")
        return None
    check.unknown_keys(data, TOP_KEYS, (), "a Runtime workflow")
    if data.get("schema") != SCHEMA:
        check.error(("schema",), "invalid-value", f"schema must be {SCHEMA}")
    limits = check.mapping(data.get("limits") or {}, ("limits",), "limits") or {}
    check.unknown_keys(limits, LIMIT_KEYS, ("limits",), "limits")
    budget = check.integer(limits, "maxTransitions", ("limits",), lo=1)
    duration = check.integer(limits, "maxRunDurationMs", ("limits",), lo=1)
    agent_time = check.integer(limits, "maxAgentTimeMs", ("limits",), lo=1)
    cost = limits.get("maxModelCost")
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, int | float) or cost <= 0
    ):
        check.error(
            ("limits", "maxModelCost"), "invalid-value", "maxModelCost must be a number > 0"
        )
        cost = None
    coordinator = check.string(data, "coordinator", (), min_len=1)
    steps = check.items(data.get("steps"), ("steps",), "steps") if "steps" in data else None
    if steps is None:
        if "steps" not in data:
            check.error((), "missing-field", "missing required field 'steps'")
        return None
    if not 1 <= len(steps) <= 128:
        check.error(("steps",), "invalid-value", "a workflow has 1 to 128 steps")
    ids: dict[str, int] = {}
    for i, step in enumerate(steps):
        if isinstance(step, dict) and isinstance(step.get("id"), str):
            if step["id"] in ids:
                check.error(("steps", i, "id"), "duplicate-step", f"step id {step['id']!r} twice")
            ids.setdefault(step["id"], i)
    for i, step in enumerate(steps):
        _check_step(check, step, i, ids, budget, coordinator)
    if len(diags) != before:
        return None
    name = re.sub(r"[^a-z0-9-]+", "-", _stem(src.path)).strip("-")[:63].strip("-") or "kxm"
    lowered = Lowered(DIALECT, src)
    out = Lowering(src, DIALECT)
    states: dict[str, Any] = {}
    capabilities: list[str] = []
    context: dict[str, Any] = {"cost": 0, "transitions": 0, "_limit": budget or 0}
    for i, step in enumerate(steps):
        _lower_step(out, step, i, ids, states, capabilities, context, coordinator, agent_time, cost)
    context.pop("_limit")
    context.update({"outcome": "", "reason": "", "refused": ""})
    _terminals(states)
    spec: dict[str, Any] = {
        "context": context,
        "budget": {"max_transitions": 2000, "max_actions": 2000},
        "initial_state": _state(steps[0]["id"]),
        "states": states,
    }
    if duration is not None:
        spec["deadline"] = {"after": f"{duration}ms"}
        out.at(("spec", "deadline"), ("limits", "maxRunDurationMs"))
        out.note(
            ("spec", "deadline"), "limits.maxRunDurationMs: the run fails with timeout after it"
        )
    if cost is not None:
        out.note(
            ("spec", "context", "cost"),
            f"limits.maxModelCost {cost} {limits.get('currency', '')}: the sum of the `cost` each "
            "agent answers with; the answer that takes it over fails the run (budget_exceeded)",
        )
    if budget is not None:
        out.note(
            ("spec", "context", "transitions"), f"limits.maxTransitions {budget}: back-edges taken"
        )
    out.note(("metadata", "name"), f"a Runtime workflow's id is its file name: {name}")
    metadata: dict[str, Any] = {"name": name, "annotations": {"kxm.schema": SCHEMA}}
    if isinstance(data.get("description"), str):
        metadata["description"] = data["description"]
    native = {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata, "spec": spec}
    lowered.workflows.append(out.finish(native, lowered))
    agent = Lowering(src, DIALECT)
    agent.note(("metadata",), "implied by the steps' agents, gates and coordinator")
    lowered.agents.append(
        agent.finish(
            agent_def(
                f"{name}-agents"[:63].strip("-"),
                ((c, f"kxm {c[4:]}") for c in capabilities),
            ),
            lowered,
        )
    )
    return lowered


def _stem(path: str) -> str:
    from pathlib import PurePath

    stem = PurePath(path).name
    for suffix in (".yaml", ".yml"):
        stem = stem.removesuffix(suffix)
    return stem.lower()


def _outcomes(step: dict[str, Any]) -> list[str]:
    on = step.get("on")
    return [str(k) for k in on] if isinstance(on, dict) else []


def _check_step(
    check: Checker,
    step: Any,
    i: int,
    ids: dict[str, int],
    budget: int | None,
    coordinator: str | None,
) -> None:
    path: Path = ("steps", i)
    if check.mapping(step, path, "a step") is None:
        return
    check.unknown_keys(step, STEP_KEYS, path, "a step")
    step_id = check.string(step, "id", path, required=True, min_len=1)
    kind = step.get("kind")
    if kind not in KINDS:
        check.error(
            (*path, "kind") if "kind" in step else path,
            "invalid-value",
            f"kind must be one of {', '.join(KINDS[:-1])}",
        )
        return
    if kind == "workflow":
        check.error((*path, "kind"), "reserved", "kind workflow is reserved")
    if (
        kind == "agent"
        and not step.get("agent")
        and not coordinator
        and not step.get("assignments")
    ):
        check.error(path, "missing-field", "an agent step needs agent (or a coordinator)")
    if kind == "moa":
        agents = step.get("agents")
        if (
            not isinstance(agents, list)
            or not agents
            or not all(isinstance(a, str) for a in agents)
        ):
            check.error(
                (*path, "agents") if "agents" in step else path,
                "missing-field",
                "a moa step needs agents: a list of agent names",
            )
    if "join" in step and step["join"] not in JOINS:
        check.error((*path, "join"), "invalid-value", f"join must be one of {', '.join(JOINS)}")
    if step.get("join") == "quorum":
        check.integer(step, "quorum", path, lo=1, required=True)
    if kind == "gate":
        check.string(step, "gate", path, required=True, min_len=1)
        expect = step.get("expect", "pass")
        if not isinstance(expect, str) or expect not in GATE_OUTCOMES:
            check.error((*path, "expect"), "invalid-value", "expect must be pass or fail")
        else:
            produced = GATE_OUTCOMES[expect]
            declared = _outcomes(step)
            for key in declared:
                if key.replace("_", "-") in produced and key not in produced:
                    check.error(
                        (*path, "on", key),
                        "gate-outcome-renamed",
                        f"gate outcome {key!r} is spelled {key.replace('_', '-')!r}",
                        key=True,
                    )
                elif key not in produced:
                    check.error(
                        (*path, "on", key),
                        "gate-outcome-impossible",
                        f"an expect: {expect} gate never produces {key!r} "
                        f"(it produces {' and '.join(produced)})",
                        key=True,
                    )
            for key in produced:
                if key not in declared and key.replace("-", "_") not in declared:
                    check.error(
                        (*path, "on") if "on" in step else path,
                        "gate-outcome-impossible",
                        f"the gate produces {key!r}: declare it",
                        key="on" in step,
                    )
    check.integer(step, "timeoutMs", path, lo=1)
    check.string(step, "agent", path, min_len=1)
    check.string(step, "prompt", path)
    check.string(step, "signalKey", path, min_len=1)
    if "assignments" in step:
        listed = check.items(step["assignments"], (*path, "assignments"), "assignments") or []
        for j, entry in enumerate(listed):
            apath: Path = (*path, "assignments", j)
            if check.mapping(entry, apath, "an assignment") is not None:
                check.string(entry, "agent", apath, required=True, min_len=1)
                check.integer(entry, "count", apath, lo=1)
    evidence = step.get("requiredEvidence") or []
    if not isinstance(evidence, list):
        check.error((*path, "requiredEvidence"), "wrong-type", "requiredEvidence must be a list")
        evidence = []
    for j, entry in enumerate(evidence):
        epath: Path = (*path, "requiredEvidence", j)
        if check.mapping(entry, epath, "an evidence requirement") is None:
            continue
        check.unknown_keys(
            entry, {"key", "kind", "producerPolicy"}, epath, "an evidence requirement"
        )
        check.string(entry, "key", epath, required=True, min_len=1)
        check.string(entry, "kind", epath, required=True, min_len=1)
    if "on" not in step:
        check.error(path, "missing-field", "on is required on every step")
        return
    on = check.mapping(step["on"], (*path, "on"), "on")
    if not on:
        if on is not None:
            check.error((*path, "on"), "invalid-value", "on declares no outcome")
        return
    for key, value in on.items():
        opath: Path = (*path, "on", key)
        edge = {"target": value} if isinstance(value, str) else value
        if not isinstance(edge, dict) or not isinstance(edge.get("target"), str):
            check.error(
                opath,
                "wrong-type",
                "a transition is a step id or {target, maxTransitions, terminalStatus}",
            )
            continue
        target = edge["target"]
        if target == TERMINAL:
            if edge.get("terminalStatus") not in STATUSES:
                check.error(
                    opath,
                    "terminal-status",
                    "$terminal needs terminalStatus: completed, failed or cancelled",
                )
            continue
        if target not in ids:
            check.error(opath, "unknown-step", f"transition to unknown step {target!r}")
            continue
        if ids[target] <= i:
            if not isinstance(edge.get("maxTransitions"), int) or edge["maxTransitions"] < 1:
                check.error(
                    opath,
                    "back-edge-budget",
                    f"the back-edge {step_id} -> {target} needs its own maxTransitions",
                )
            if budget is None:
                check.error(
                    opath,
                    "back-edge-budget",
                    f"the back-edge {step_id} -> {target} needs limits.maxTransitions",
                )


def _terminals(states: dict[str, Any]) -> None:
    states["completed"] = {
        "type": "terminal",
        "outputs": {"status": "completed", "outcome": "{{ context.outcome }}"},
    }
    states["failed"] = {
        "type": "terminal",
        "fail": {"message": "{{ context.reason }}"},
        "outputs": {"status": "failed", "reason": "{{ context.reason }}"},
    }
    states["cancelled"] = {
        "type": "terminal",
        "fail": {"message": "{{ context.reason }}", "class": "cancelled"},
        "outputs": {"status": "cancelled", "reason": "{{ context.reason }}"},
    }
    states["over_budget"] = {
        "type": "terminal",
        "fail": {"message": "{{ context.reason }}", "class": "budget_exceeded"},
        "outputs": {"status": "failed", "reason": "{{ context.reason }}"},
    }


def _edges(
    step: dict[str, Any],
    i: int,
    ids: dict[str, int],
    event: str,
    outcome: str,
    context: dict[str, Any],
    extra_guard: str | None = None,
    writes: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One transition per declared outcome (``outcome`` is the CEL giving it); anything
    not declared is ``failed``."""
    out: list[dict[str, Any]] = []
    on = step["on"]
    declared = list(on)
    base_writes = dict(writes or {})

    def goto(key: str) -> list[dict[str, Any]]:
        value = on[key]
        edge = {"target": value} if isinstance(value, str) else value
        target = edge["target"]
        sets = {**base_writes, "outcome": key}
        if target == TERMINAL:
            status = edge["terminalStatus"]
            if status != "completed":
                sets["reason"] = f"{step['id']}: {key} ({status})"
            return [
                {
                    "target": {
                        "completed": "completed",
                        "failed": "failed",
                        "cancelled": "cancelled",
                    }[status],
                    "set": sets,
                }
            ]
        if ids[target] <= i:
            counter = f"edge:{step['id']}:{key}"
            context[counter] = 0
            within = (
                f"{_ctx(counter)} < {edge['maxTransitions']}"
                f" && context.transitions < {context['_limit']}"
            )
            return [
                {
                    "target": _state(target),
                    "guard": within,
                    "set": {
                        **sets,
                        counter: "{{ " + _ctx(counter) + " + 1 }}",
                        "transitions": "{{ context.transitions + 1 }}",
                    },
                },
                {
                    "target": "over_budget",
                    "set": {
                        "reason": f"transition_budget_exhausted: {step['id']} -> {target} ({key})"
                    },
                },
            ]
        return [{"target": _state(target), "set": sets}]

    constant = json.loads(outcome) if re.fullmatch(r'"[^"\\]*"', outcome) else None
    for key in declared:
        if constant is not None and key != constant:
            continue
        test = None if constant is not None else f"{outcome} == {_q(key)}"
        for entry in goto(key):
            guard = " && ".join(p for p in [extra_guard, test, entry.get("guard")] if p)
            item: dict[str, Any] = {"event": event, "goto": entry["target"], "set": entry["set"]}
            if guard:
                item["guard"] = guard
            out.append(item)
        if constant is not None and not any(e.get("guard") for e in goto(key)):
            return out
    if constant is not None and constant in declared:
        return out
    if "failed" in declared:
        for entry in goto("failed"):
            fallback = " && ".join(p for p in [extra_guard, entry.get("guard")] if p)
            item = {"event": event, "goto": entry["target"], "set": entry["set"]}
            if fallback:
                item["guard"] = fallback
            out.append(item)
    else:
        item = {
            "event": event,
            "goto": "failed",
            "set": {"reason": f"{step['id']}: an outcome it does not declare (failed)"},
        }
        if extra_guard:
            item["guard"] = extra_guard
        out.append(item)
    return out


def _lower_step(
    out: Lowering,
    step: dict[str, Any],
    i: int,
    ids: dict[str, int],
    states: dict[str, Any],
    capabilities: list[str],
    context: dict[str, Any],
    coordinator: str | None,
    agent_time: int | None,
    cost: float | None,
) -> None:
    name = _state(step["id"])
    out.at(("spec", "states", name), ("steps", i))
    kind = step["kind"]
    outcomes = _outcomes(step)
    timeout = step.get("timeoutMs") or agent_time
    state: dict[str, Any] = {}
    if step.get("description"):
        state["description"] = str(step["description"])

    def action(agent: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        cap = _capability(agent)
        if cap not in capabilities:
            capabilities.append(cap)
        entry: dict[str, Any] = {
            "capability": cap,
            "input": {
                "run": "{{ run.id }}",
                "step": step["id"],
                "prompt": step.get("prompt", ""),
                "outcomes": outcomes,
                **(extra or {}),
            },
        }
        if timeout:
            entry["timeout"] = f"{timeout}ms"
        return entry

    required = [e["key"] for e in step.get("requiredEvidence") or [] if isinstance(e, dict)]
    evidence_ok = " && ".join(
        f'("evidence" in result && {_q(k)} in result.evidence && result.evidence[{_q(k)}] != "")'
        for k in required
    )
    spent = '(("cost" in result) ? double(result.cost) : 0.0)'
    cost_writes = {"cost": "{{ double(context.cost) + " + spent + " }}"} if cost is not None else {}
    cost_guard: list[dict[str, Any]] = []
    if cost is not None:
        cost_guard = [
            {
                "event": "task.completed",
                "guard": f"double(context.cost) + {spent} > {float(cost)}",
                "goto": "over_budget",
                "set": {"reason": f"maxModelCost {cost} exceeded at {step['id']}"},
            }
        ]
    if kind in ("agent", "workflow"):
        agents = [
            a["agent"]
            for a in step.get("assignments") or []
            if isinstance(a, dict) and a.get("agent")
            for _ in range(a.get("count", 1))
        ]
        if agents:
            state["parallel"] = {
                "completion": _completion(step),
                "actions": [action(a) for a in agents],
            }
            on = cost_guard + _joined(step, i, ids, context, cost_writes)
        else:
            state["actions"] = [action(step.get("agent") or coordinator or "agent")]
            outcome = '(("outcome" in result) ? result.outcome : "failed")'
            on = list(cost_guard)
            if required:
                # A declared outcome other than failed needs the evidence; without it the
                # step is asked again.
                on.append(
                    {
                        "event": "task.completed",
                        "guard": f'{outcome} != "failed" && !({evidence_ok})',
                        "goto": name,
                        "set": {"refused": f"{step['id']}: evidence incomplete"},
                    }
                )
            on += _edges(step, i, ids, "task.completed", outcome, context, writes=cost_writes)
            on += _edges(step, i, ids, "task.failed", '"failed"', context)
        state["on"] = on
    elif kind == "moa":
        state["parallel"] = {
            "completion": _completion(step),
            "actions": [action(a) for a in step["agents"]],
        }
        state["on"] = cost_guard + _joined(step, i, ids, context, cost_writes)
    elif kind == "gate":
        expect = step.get("expect", "pass")
        state["actions"] = [action("gate", {"gate": step["gate"], "expect": expect})]
        succeeded = '("ok" in result && result.ok == true)'
        if expect == "pass":
            outcome = f'({succeeded} ? "passed" : "implementation-failure")'
        else:
            outcome = f'({succeeded} ? "repro-missing" : "passed")'
        on = _edges(step, i, ids, "task.completed", outcome, context)
        on += _edges(step, i, ids, "task.failed", '"failed"', context)
        state["on"] = on
        out.note(
            ("spec", "states", name),
            f"gate {step['gate']!r} runs on the gate runner (capability kxm.gate); it answers "
            "ok: true when the command exits 0",
        )
    elif kind == "approval":
        state["type"] = "human_in_the_loop"
        state["on"] = _edges(
            step, i, ids, "kxm.approval", '(("outcome" in data) ? data.outcome : "failed")', context
        )
        out.note(
            ("spec", "states", name),
            "an approval: a kxm.approval event (data.outcome one of the declared keys) sent to "
            "the run",
        )
    elif kind == "wait":
        key = str(step.get("signalKey", step["id"]))
        state["on"] = _edges(
            step,
            i,
            ids,
            "kxm.signal",
            '(("status" in data) ? data.status : "failed")',
            context,
            f"data.signal == {_q(key)}",
        )
        out.note(
            ("spec", "states", name),
            f"a wait: a kxm.signal event with data.signal {key!r}; its status is the outcome",
        )
    states[name] = state


def _completion(step: dict[str, Any]) -> str:
    join = step.get("join", "all")
    return {
        "all": "all",
        "first-success": "any",
        "all-settled": "all_settled",
        "quorum": "all_settled",
    }[join]


def _joined(
    step: dict[str, Any],
    i: int,
    ids: dict[str, int],
    context: dict[str, Any],
    writes: dict[str, Any],
) -> list[dict[str, Any]]:
    """A parallel step's outcome: passed when the join holds, else failed."""
    join = step.get("join", "all")
    if join == "quorum":
        ok = f'result.filter(r, r.status == "completed").size() >= {int(step["quorum"])}'
        outcome = f'({ok} ? "passed" : "failed")'
    elif join == "all-settled":
        outcome = '"passed"'
    else:
        outcome = '"passed"'
    writes = {**writes}
    writes.pop("cost", None)  # a list result carries no single cost
    on = _edges(step, i, ids, "task.completed", outcome, context, writes=writes)
    return on + _edges(step, i, ids, "task.failed", '"failed"', context)
