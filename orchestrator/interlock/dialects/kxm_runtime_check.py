"""kxm Runtime workflows (``schema: kxm.workflow.v1``) as the Runtime reads them: its
load-time rules, checked with rule ids ``kxm.<rule>`` at their place in the file (the
workflow's keys and limits, each step's kind and fields, gate outcomes, evidence, and the
transitions with their budgets). What a checked workflow becomes is in
:mod:`interlock.dialects.kxm_runtime`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.dialects.base import Checker

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
    "instructions",
    "maxAttempts",
    "repositories",
}
"""The step fields this loader reads. Another key is kept (an annotation of the converted
workflow) with a warning, not refused: kxm's full field reference is not at hand here."""
STEP_ATTEMPTS_CODE = "budget_step_attempts"
"""The Runtime's code for a step attempted more than its ``maxAttempts``."""
LIMIT_KEYS = {
    "maxTransitions",
    "maxRunDurationMs",
    "maxAgentTimeMs",
    "maxModelCost",
    "currency",
}


@dataclass(slots=True)
class Checked:
    """A Runtime workflow that passed its load-time rules, with its limits read."""

    data: dict[str, Any]
    limits: dict[str, Any]
    steps: list[dict[str, Any]]
    ids: dict[str, int]
    """Each step id and its position."""
    coordinator: str | None
    budget: int | None
    duration: int | None
    agent_time: int | None
    cost: float | None
    unknown: list[tuple[int, str]]
    """Step keys this loader does not know (step index, key): warned of, and kept."""


def check(src: Document, diags: list[Diagnostic]) -> Checked | None:
    """The workflow in ``src`` when it keeps every load-time rule, else None."""
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
    unknown: list[tuple[int, str]] = []
    for i, step in enumerate(steps):
        _check_step(check, step, i, ids, budget, coordinator)
        if isinstance(step, dict):
            unknown += [(i, str(k)) for k in step if k not in STEP_KEYS]
    if len(diags) != before:
        return None
    return Checked(
        data, limits, steps, ids, coordinator, budget, duration, agent_time, cost, unknown
    )


def unknown_key_warnings(src: Document, checked: Checked) -> list[Diagnostic]:
    """A warning per step key this loader does not know (kept in the annotations)."""
    out = []
    for i, key in checked.unknown:
        step_id = checked.steps[i]["id"]
        out.append(
            src.diag(
                ("steps", i, key),
                f"{DIALECT}.unknown-key",
                f"step {step_id!r}: key {key!r} is not one this loader knows; it is kept "
                f"(annotation {annotation_key(step_id, key)}) and not acted on",
                key=True,
            )
        )
    return out


def annotation_key(step_id: str, key: str) -> str:
    """Where an unknown step key is kept in the converted workflow's annotations."""
    return f"kxm.step.{step_id}.{key}"


def outcomes(step: dict[str, Any]) -> list[str]:
    """The outcome keys a step declares under ``on``."""
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
        _check_gate(check, step, path)
    check.integer(step, "timeoutMs", path, lo=1)
    check.integer(step, "maxAttempts", path, lo=1)
    check.string(step, "agent", path, min_len=1)
    check.string(step, "prompt", path)
    check.string(step, "instructions", path)
    if "repositories" in step:
        check.items(step["repositories"], (*path, "repositories"), "repositories")
    check.string(step, "signalKey", path, min_len=1)
    if "assignments" in step:
        listed = check.items(step["assignments"], (*path, "assignments"), "assignments") or []
        for j, entry in enumerate(listed):
            apath: Path = (*path, "assignments", j)
            if check.mapping(entry, apath, "an assignment") is not None:
                check.string(entry, "agent", apath, required=True, min_len=1)
                check.integer(entry, "count", apath, lo=1)
    _check_evidence(check, step, path)
    if "on" not in step:
        check.error(path, "missing-field", "on is required on every step")
        return
    on = check.mapping(step["on"], (*path, "on"), "on")
    if not on:
        if on is not None:
            check.error((*path, "on"), "invalid-value", "on declares no outcome")
        return
    for key, value in on.items():
        _check_edge(check, (*path, "on", key), value, step_id, i, ids, budget)


def _check_gate(check: Checker, step: dict[str, Any], path: Path) -> None:
    """A gate names its gate, and declares exactly the outcomes its ``expect`` produces."""
    check.string(step, "gate", path, required=True, min_len=1)
    expect = step.get("expect", "pass")
    if not isinstance(expect, str) or expect not in GATE_OUTCOMES:
        check.error((*path, "expect"), "invalid-value", "expect must be pass or fail")
    else:
        produced = GATE_OUTCOMES[expect]
        declared = outcomes(step)
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


def _check_evidence(check: Checker, step: dict[str, Any], path: Path) -> None:
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


def _check_edge(
    check: Checker,
    opath: Path,
    value: Any,
    step_id: str | None,
    i: int,
    ids: dict[str, int],
    budget: int | None,
) -> None:
    """One transition: a known step or ``$terminal`` with a status; a back-edge budgeted."""
    edge = {"target": value} if isinstance(value, str) else value
    if not isinstance(edge, dict) or not isinstance(edge.get("target"), str):
        check.error(
            opath,
            "wrong-type",
            "a transition is a step id or {target, maxTransitions, terminalStatus}",
        )
        return
    target = edge["target"]
    if target == TERMINAL:
        if edge.get("terminalStatus") not in STATUSES:
            check.error(
                opath,
                "terminal-status",
                "$terminal needs terminalStatus: completed, failed or cancelled",
            )
        return
    if target not in ids:
        check.error(opath, "unknown-step", f"transition to unknown step {target!r}")
        return
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
