"""kxm Runtime workflows: the transitions a step's outcomes take (declared targets,
``$terminal`` with its status, budgeted back-edges, and edges into a step with
``maxAttempts``), and the ends the run can reach. The steps themselves are lowered in
:mod:`interlock.dialects.kxm_runtime`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from interlock.dialects.kxm_runtime_check import STEP_ATTEMPTS_CODE, TERMINAL
from interlock.dialects.kxm_states import context_ref, q, state_name


def terminals(states: dict[str, Any]) -> None:
    """The ends the steps' transitions reach (an end no transition reaches would be an
    unreachable state: a workflow without a cancelled terminal has none)."""
    reached = {
        entry.get("goto")
        for state in states.values()
        for entry in state.get("on", [])
        if isinstance(entry, dict)
    }
    ends: dict[str, Any] = {}
    ends["completed"] = {
        "type": "terminal",
        "outputs": {"status": "completed", "outcome": "{{ context.outcome }}"},
    }
    ends["failed"] = {
        "type": "terminal",
        "fail": {"message": "{{ context.reason }}"},
        "outputs": {"status": "failed", "reason": "{{ context.reason }}"},
    }
    ends["cancelled"] = {
        "type": "terminal",
        "fail": {"message": "{{ context.reason }}", "class": "cancelled"},
        "outputs": {"status": "cancelled", "reason": "{{ context.reason }}"},
    }
    ends["over_budget"] = {
        "type": "terminal",
        "fail": {"message": "{{ context.reason }}", "class": "budget_exceeded"},
        "outputs": {"status": "failed", "reason": "{{ context.reason }}"},
    }
    states.update({name: end for name, end in ends.items() if name in reached})


def outcome_edges(
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
    declared = list(step["on"])
    base_writes = dict(writes or {})

    def goto(key: str) -> list[dict[str, Any]]:
        return _goto(step, i, ids, context, key, base_writes)

    constant = json.loads(outcome) if re.fullmatch(r'"[^"\\]*"', outcome) else None
    for key in declared:
        if constant is not None and key != constant:
            continue
        test = None if constant is not None else f"{outcome} == {q(key)}"
        for entry in goto(key):
            guard = " && ".join(p for p in [extra_guard, test, entry.get("guard")] if p)
            item: dict[str, Any] = {"event": event, "goto": entry["target"], "set": entry["set"]}
            if guard:
                item["guard"] = guard
            if entry.get("budget"):
                item["budget"] = entry["budget"]
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
            if entry.get("budget"):
                item["budget"] = entry["budget"]
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


def _goto(
    step: dict[str, Any],
    i: int,
    ids: dict[str, int],
    context: dict[str, Any],
    key: str,
    writes: dict[str, Any],
) -> list[dict[str, Any]]:
    """Where outcome ``key`` of ``step`` goes: a terminal, a step, or a budgeted back-edge
    (with the transition that fails the run once the budget is spent)."""
    value = step["on"][key]
    edge = {"target": value} if isinstance(value, str) else value
    target = edge["target"]
    sets = {**writes, "outcome": key}
    limit = context["_attempts"].get(target)
    if limit is not None:
        return _attempted(step, i, ids, context, key, sets, target, limit)
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
        # A back-edge: its own budget and the run's (limits.maxTransitions).
        edges = context.setdefault("_edges", {})
        name = f"edge:{step['id']}:{key}"
        edges[name] = int(edge["maxTransitions"])
        edges["run"] = int(context["_limit"])
        return [{"target": state_name(target), "set": sets, "budget": [name, "run"]}]
    return [{"target": state_name(target), "set": sets}]


def attempts_key(step_id: str) -> str:
    return f"attempts:{step_id}"


def _attempted(
    step: dict[str, Any],
    i: int,
    ids: dict[str, int],
    context: dict[str, Any],
    key: str,
    sets: dict[str, Any],
    target: str,
    limit: int,
) -> list[dict[str, Any]]:
    """An edge into a step with ``maxAttempts``: taken while the step has attempts left
    (counting this one), else the run fails with the Runtime's ``budget_step_attempts``."""
    counter = context_ref(attempts_key(target))
    attempts = {**sets, attempts_key(target): "{{ " + counter + " + 1 }}"}
    edge = {**(step["on"][key] if isinstance(step["on"][key], dict) else {}), "target": target}
    counted = context["_attempts"]
    context["_attempts"] = {k: v for k, v in counted.items() if k != target}
    try:  # the edge itself, as it is without the count (a back-edge's budgets kept)
        inner = _goto({**step, "on": {key: edge}}, i, ids, context, key, {})
    finally:
        context["_attempts"] = counted
    out = []
    for entry in inner:
        guard = " && ".join(p for p in [entry.get("guard"), f"{counter} < {limit}"] if p)
        out.append({**entry, "set": {**attempts, **entry["set"]}, "guard": guard})
    out.append(
        {
            "target": "over_budget",
            "set": {
                **sets,
                "reason": f"{STEP_ATTEMPTS_CODE}: step {target!r} would be attempted more "
                f"than its maxAttempts ({limit}) times",
            },
        }
    )
    return out
