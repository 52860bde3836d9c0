"""kxm Runtime workflows (``schema: kxm.workflow.v1``), loaded as written.

Steps connected by typed transitions become states: an ``agent`` step asks its agent for
one of the step's declared outcome keys (anything else is ``failed``); ``moa`` asks several
agents at once and joins them (``all``, ``all-settled``, ``quorum``, ``first-success``);
``gate`` asks the gate runner to run a gate and derives the outcome from ``expect``;
``approval`` waits for a ``kxm.approval`` event and ``wait`` for a ``kxm.signal``; ``$terminal``
ends the run with its ``terminalStatus``. Back-edges count against their own and the
workflow's ``maxTransitions``, ``maxRunDurationMs`` is the run's deadline, and
``maxModelCost`` is the native cost budget (``budget.max_cost``), summed by the engine
from the ``cost`` each agent reports; a ``quorum`` join is a native quorum.

The Runtime's load-time rules are checked with rule ids ``kxm.<rule>`` (``kxm.gate-outcome-
impossible``, ``kxm.gate-outcome-renamed``, ``kxm.back-edge-budget``...).
"""

from __future__ import annotations

import json
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document
from interlock.dialects.base import API_VERSION, Lowered, Lowering, agent_def
from interlock.dialects.kxm_runtime_check import (
    DIALECT,
    SCHEMA,
    Checked,
    annotation_key,
    check,
    outcomes,
    unknown_key_warnings,
)
from interlock.dialects.kxm_runtime_edges import (
    attempts_key,
    outcome_edges,
    terminals,
)
from interlock.dialects.kxm_states import capability, dns_label, q, state_name


def detect(data: Any) -> bool:
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    checked = check(src, diags)
    if checked is None:
        return None
    steps = checked.steps
    name = dns_label(_stem(src.path))
    lowered = Lowered(DIALECT, src, warnings=unknown_key_warnings(src, checked))
    out = Lowering(src, DIALECT)
    states: dict[str, Any] = {}
    capabilities: list[str] = []
    attempts = {
        str(s["id"]): int(s["maxAttempts"]) for s in steps if isinstance(s.get("maxAttempts"), int)
    }
    context: dict[str, Any] = {"_limit": checked.budget or 0, "_attempts": attempts}
    for i, step in enumerate(steps):
        _Step(out, step, i, checked, capabilities, context).lower(states)
    context.pop("_limit")
    context.pop("_attempts")
    for step_id in attempts:
        context[attempts_key(step_id)] = 1 if step_id == steps[0]["id"] else 0
    edges = context.pop("_edges", {})
    context.update({"outcome": "", "reason": ""})
    terminals(states)
    spec: dict[str, Any] = {
        "context": context,
        "budget": _budget(checked, edges),
        "initial_state": state_name(steps[0]["id"]),
        "states": states,
    }
    _limits(out, checked, spec)
    out.note(("metadata", "name"), f"a Runtime workflow's id is its file name: {name}")
    metadata: dict[str, Any] = {"name": name, "annotations": {"kxm.schema": SCHEMA}}
    for i, key in checked.unknown:
        step_id = str(steps[i]["id"])
        kept = annotation_key(step_id, key)
        metadata["annotations"][kept] = json.dumps(steps[i][key], sort_keys=True)
        out.at(("metadata", "annotations", kept), ("steps", i, key))
        out.note(
            ("metadata", "annotations"),
            f"step {step_id!r}: {key!r} is not a field this loader knows (kxm's full field "
            f"reference is not at hand): kept as the annotation {kept}, not acted on",
        )
    if isinstance(checked.data.get("description"), str):
        metadata["description"] = checked.data["description"]
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


def _limits(out: Lowering, checked: Checked, spec: dict[str, Any]) -> None:
    """The workflow's limits: a deadline, and notes on the cost and transition budgets."""
    duration, cost, budget = checked.duration, checked.cost, checked.budget
    if duration is not None:
        spec["deadline"] = {"after": f"{duration}ms"}
        out.at(("spec", "deadline"), ("limits", "maxRunDurationMs"))
        out.note(
            ("spec", "deadline"), "limits.maxRunDurationMs: the run fails with timeout after it"
        )
    if cost is not None:
        out.at(("spec", "budget", "max_cost"), ("limits", "maxModelCost"))
        out.note(
            ("spec", "budget", "max_cost"),
            f"limits.maxModelCost {cost} {checked.limits.get('currency', '')}: the sum of the "
            "`cost` each agent answers with (run.cost); the answer that takes it over fails "
            "the run (budget_exceeded)",
        )
    if budget is not None and "edges" in spec["budget"]:
        out.note(
            ("spec", "budget", "edges"),
            f"limits.maxTransitions {budget} (run) and each back-edge's own maxTransitions: "
            "edge budgets the back-edges count against; spent, the run fails "
            "(budget_exceeded)",
        )


def _budget(checked: Checked, edges: dict[str, int]) -> dict[str, Any]:
    budget: dict[str, Any] = {"max_transitions": 2000, "max_actions": 2000}
    if checked.cost is not None:
        budget["max_cost"] = checked.cost
    if edges:
        budget["edges"] = edges
    return budget


def _stem(path: str) -> str:
    from pathlib import PurePath

    stem = PurePath(path).name
    for suffix in (".yaml", ".yml"):
        stem = stem.removesuffix(suffix)
    return stem.lower()


class _Step:
    """One step lowered to its state: the actions it requests and the transitions its
    outcomes take."""

    def __init__(
        self,
        out: Lowering,
        step: dict[str, Any],
        i: int,
        checked: Checked,
        capabilities: list[str],
        context: dict[str, Any],
    ) -> None:
        self.out = out
        self.step = step
        self.i = i
        self.ids = checked.ids
        self.coordinator = checked.coordinator
        self.cost = checked.cost
        self.capabilities = capabilities
        self.context = context
        self.name = state_name(step["id"])
        self.outcomes = outcomes(step)
        self.timeout = step.get("timeoutMs") or checked.agent_time
        self.cost_guard: list[dict[str, Any]] = []
        if self.cost is not None:
            # The answer that takes run.cost over budget.max_cost fails the state with
            # code max_cost: the run fails, whatever the step's failed outcome says.
            self.cost_guard = [
                {
                    "event": "task.failed",
                    "guard": 'result.error.code == "max_cost"',
                    "goto": "over_budget",
                    "set": {"reason": f"maxModelCost {self.cost} exceeded at {step['id']}"},
                }
            ]

    def lower(self, states: dict[str, Any]) -> None:
        step = self.step
        self.out.at(("spec", "states", self.name), ("steps", self.i))
        kind = step["kind"]
        state: dict[str, Any] = {}
        if step.get("description"):
            state["description"] = str(step["description"])
        if kind in ("agent", "workflow"):
            self.agent(state)
        elif kind == "moa":
            agents = [str(a) for a in step["agents"]]
            state["parallel"] = {
                "completion": _completion(step, agents),
                "actions": [self.action(a) for a in agents],
            }
            state["on"] = self.cost_guard + _joined(step, self.i, self.ids, self.context, agents)
        elif kind == "gate":
            self.gate(state)
        elif kind == "approval":
            state["type"] = "human_in_the_loop"
            state["on"] = self.edges(
                "kxm.approval", '(("outcome" in data) ? data.outcome : "failed")'
            )
            self.out.note(
                ("spec", "states", self.name),
                "an approval: a kxm.approval event (data.outcome one of the declared keys) sent "
                "to the run",
            )
        elif kind == "wait":
            key = str(step.get("signalKey", step["id"]))
            state["on"] = self.edges(
                "kxm.signal",
                '(("status" in data) ? data.status : "failed")',
                f"data.signal == {q(key)}",
            )
            self.out.note(
                ("spec", "states", self.name),
                f"a wait: a kxm.signal event with data.signal {key!r}; its status is the outcome",
            )
        states[self.name] = state

    def edges(
        self,
        event: str,
        outcome: str,
        extra_guard: str | None = None,
        writes: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        return outcome_edges(
            self.step, self.i, self.ids, event, outcome, self.context, extra_guard, writes
        )

    def action(self, agent: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        cap = capability(agent)
        if cap not in self.capabilities:
            self.capabilities.append(cap)
        entry: dict[str, Any] = {
            "capability": cap,
            "input": {
                "run": "{{ run.id }}",
                "step": self.step["id"],
                "prompt": self.step.get("prompt", ""),
                "outcomes": self.outcomes,
                **(extra or {}),
            },
        }
        if "instructions" in self.step:
            entry["input"]["instructions"] = self.step["instructions"]
        if self.timeout:
            entry["timeout"] = f"{self.timeout}ms"
        return entry

    def agent(self, state: dict[str, Any]) -> None:
        """An agent step: one agent (or its assignments in parallel) answers an outcome."""
        step = self.step
        agents = [
            a["agent"]
            for a in step.get("assignments") or []
            if isinstance(a, dict) and a.get("agent")
            for _ in range(a.get("count", 1))
        ]
        if agents:
            state["parallel"] = {
                "completion": _completion(step, agents),
                "actions": [self.action(a) for a in agents],
            }
            state["on"] = self.cost_guard + _joined(step, self.i, self.ids, self.context, agents)
            return
        state["actions"] = [self.action(step.get("agent") or self.coordinator or "agent")]
        outcome = '(("outcome" in result) ? result.outcome : "failed")'
        on = list(self.cost_guard)
        required = [e["key"] for e in step.get("requiredEvidence") or [] if isinstance(e, dict)]
        if required:
            # A declared outcome other than failed needs the evidence; the state's gate
            # refuses an answer without it and asks the step again (same attempt).
            state["gate"] = {
                "requires": dict.fromkeys(required, True),
                "evidence": ['"evidence" in result ? result.evidence : {}'],
                "when": f'{outcome} != "failed"',
            }
        on += self.edges("task.completed", outcome)
        on += self.edges("task.failed", '"failed"')
        state["on"] = on

    def gate(self, state: dict[str, Any]) -> None:
        """A gate step: the gate runner runs the gate; ``expect`` makes its outcome."""
        step = self.step
        expect = step.get("expect", "pass")
        request = {"gate": step["gate"], "expect": expect}
        if "repositories" in step:
            request["repositories"] = step["repositories"]  # what the gate may access
        state["actions"] = [self.action("gate", request)]
        succeeded = '("ok" in result && result.ok == true)'
        if expect == "pass":
            outcome = f'({succeeded} ? "passed" : "implementation-failure")'
        else:
            outcome = f'({succeeded} ? "repro-missing" : "passed")'
        on = self.edges("task.completed", outcome)
        on += self.edges("task.failed", '"failed"')
        state["on"] = on
        self.out.note(
            ("spec", "states", self.name),
            f"gate {step['gate']!r} runs on the gate runner (capability kxm.gate); it answers "
            "ok: true when the command exits 0",
        )


def _completion(step: dict[str, Any], agents: list[str]) -> Any:
    join = step.get("join", "all")
    if join == "quorum" and len(set(agents)) == len(agents):
        return {"at_least": int(step["quorum"])}  # distinct agents: distinct producers
    return {
        "all": "all",
        "first-success": "any",
        "all-settled": "all_settled",
        "quorum": "all_settled",
    }[join]


def _joined(
    step: dict[str, Any], i: int, ids: dict[str, int], context: dict[str, Any], agents: list[str]
) -> list[dict[str, Any]]:
    """A parallel step's outcome: passed when the join holds, else failed (a quorum out of
    reach fails the state)."""
    outcome = '"passed"'
    if not isinstance(_completion(step, agents), dict) and step.get("join") == "quorum":
        # The same agent assigned more than once: count the answers, not the producers.
        ok = f'result.filter(r, r.status == "completed").size() >= {int(step["quorum"])}'
        outcome = f'({ok} ? "passed" : "failed")'
    on = outcome_edges(step, i, ids, "task.completed", outcome, context)
    return on + outcome_edges(step, i, ids, "task.failed", '"failed"', context)
