"""kxm stages lowered to native states: the hub's checkpoints, attempts, refusals, waits,
escalations, peer replies and transition budgets, written as transitions and CEL guards over
counters kept in the run's context. :mod:`interlock.dialects.kxm` puts the states of one
definition into a workflow.
"""

from __future__ import annotations

import json
import re
from typing import Any

from interlock.core.source import Path
from interlock.dialects.base import Lowering
from interlock.dialects.kxm_check import (
    DEFAULT_TTL_MS,
    TERMINAL,
    Definition,
    Edge,
    Stage,
    normalize,
)
from interlock.dialects.kxm_refusals import (
    NO_STATUS,
    NO_STATUS_LIMIT,
    no_status,
    short_of_peers,
)

SIGNAL_EVENT = "kxm.signal"
"""A signal sent straight to a run (``interlock signal``): ``data.signal`` names its key."""
ESCALATION = "audit_escalation"
WAIT = "24h"
ANSWERED = '("evidence" in result ? result.evidence : {})'
"""The evidence a checkpoint carries (none: an empty map)."""
SIGNALLED = '("evidence" in data ? data.evidence : {})'
"""The evidence a signal carries (none: an empty map)."""
PLAN_HASH = "$planHash"
"""The gate's own predicate for ``requirePlanHash``: the plan's value, captured."""
REPRO = "$reproOracle"
"""The gate's own predicate for ``reproOracle``: missing when a checkpoint cites the
oracle's key with another value than the one confirmed (kxm's ``weakened_reproduction``)."""
_NOT_IN_TYPE = re.compile(r"[^A-Za-z0-9_.-]")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_.:-]+)\s*\}\}")


def start_type(definition_id: str, event: str | None) -> str:
    """The CloudEvent type of a delivery that starts a run: ``kxm.<id>.<event>`` (the
    event as the gateway writes it into a type), or ``kxm.<id>.delivery`` without one."""
    suffix = _NOT_IN_TYPE.sub("_", event).strip(".") if event else "delivery"
    return f"kxm.{dns_label(definition_id)}.{suffix}"


def signal_type(definition_id: str, key: str) -> str:
    """The CloudEvent type of a signal through the gateway: ``kxm.<id>.signal.<key>``."""
    return f"kxm.{dns_label(definition_id)}.signal.{_NOT_IN_TYPE.sub('_', key).strip('.')}"


def q(text: str) -> str:
    """``text`` as a CEL (JSON) string literal."""
    return json.dumps(text)


def context_ref(key: str) -> str:
    return f"context[{q(key)}]"


def capability(name: str) -> str:
    return "kxm." + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "agent")


def dns_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-") or "kxm"


def state_name(step_id: str) -> str:
    """A step's or stage's id as a state's name (letters first, no other punctuation)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", step_id)
    return name if name[:1].isalpha() else f"s_{name}"


def _prompt(template: str) -> str:
    """``{{dotted.path}}`` from the payload (the run's inputs); a missing value is empty."""

    def each(match: re.Match[str]) -> str:
        parts = match.group(1).split(".")
        tests = []
        for n in range(len(parts)):
            parent = "inputs" + "".join(f"[{q(p)}]" for p in parts[:n])
            tests.append(f"{q(parts[n])} in {parent}")
        value = "inputs" + "".join(f"[{q(p)}]" for p in parts)
        return "{{ " + f'({" && ".join(tests)}) ? {value} : ""' + " }}"

    return _PLACEHOLDER.sub(each, template)


class StageLowering:
    def __init__(self, definition: Definition, out: Lowering) -> None:
        self.d = definition
        self.out = out
        self.states: dict[str, Any] = {}
        self.names = {s.id: state_name(s.id) for s in definition.stages}
        self.ids = {s.id: k for k, s in enumerate(definition.stages)}
        self.gated = False
        self.budgets: dict[str, int] = {}
        """The edge budgets the declared transitions count against, with their limits."""

    # counters and statuses in the context
    def attempts(self, s: Stage) -> str:
        return context_ref(f"attempts:{s.id}")

    def pass_route(
        self, s: Stage, event: str, guard: str | None, evidence: str
    ) -> list[dict[str, Any]]:
        """The transitions taken when ``s`` passes."""
        writes: dict[str, Any] = {f"status:{s.id}": "passed"}
        if self.d.plan_hash and self.d.plan_hash[0] == s.id:
            writes["plan"] = "{{ " + _evidence_value(evidence, self.d.plan_hash[1]) + " }}"
        if self.d.repro and self.d.repro[0] == s.id:
            writes["repro"] = "{{ " + _evidence_value(evidence, self.d.repro[1]) + " }}"
        writes[f"evidence:{s.id}"] = "{{ " + evidence + " }}"
        edge = s.on.get("passed")
        if edge is not None:
            return self.declared(s, edge, event, guard, writes)
        # Default: the first stage still pending, in definition order.
        out = []
        for other in self.d.stages:
            if other.id == s.id:
                continue
            cond = f'{context_ref("status:" + other.id)} != "passed"'
            out.append(
                self.edge(
                    event, _and(guard, cond), self.names[other.id], {**writes, **self.reset(other)}
                )
            )
        out.append(self.edge(event, guard, "completed", writes))
        return out

    def reset(self, s: Stage) -> dict[str, Any]:
        """Entering a stage resets its attempts and evidence."""
        return {f"attempts:{s.id}": 0, f"status:{s.id}": "in_progress", f"evidence:{s.id}": {}}

    def edge(
        self,
        event: str,
        guard: str | None,
        goto: str,
        writes: dict[str, Any],
        budget: list[str] | None = None,
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"event": event}
        if guard:
            entry["guard"] = guard
        entry["goto"] = goto
        if writes:
            entry["set"] = writes
        if budget:
            entry["budget"] = budget
        return entry

    def declared(
        self, s: Stage, edge: Edge, event: str, guard: str | None, writes: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """A declared transition, counting against the edge budgets kxm gives it: the
        definition's (``run``), its stage's (``stage:<id>``) and its own
        (``edge:<id>:<outcome>``); only declared transitions count."""
        budgets = [
            (name, n)
            for name, n in (
                ("run", self.d.budget),
                (f"stage:{s.id}", s.budget),
                (f"edge:{s.id}:{edge.outcome}", edge.budget),
            )
            if n is not None
        ]
        self.budgets.update(budgets)
        if edge.target == TERMINAL:
            goto, extra = "completed", {}
        else:
            target = self.d.stages[self.ids[edge.target]]
            goto, extra = self.names[target.id], self.reset(target)
            if edge.outcome != "passed":
                extra[f"status:{s.id}"] = "pending"
        return [self.edge(event, guard, goto, {**writes, **extra}, [n for n, _ in budgets])]

    def not_passed(
        self, s: Stage, event: str, status: str, outcome: str, origin: str
    ) -> list[dict[str, Any]]:
        """A warning/failed checkpoint (or signal): a declared transition while attempts
        remain, else another attempt, an escalation, or the run fails."""
        used = f"{self.attempts(s)} + 1"
        remain = f"{used} < {s.max_attempts}"
        is_not_passed = f'{status} != "passed"'
        out: list[dict[str, Any]] = []
        for key, edge in s.on.items():
            if key == "passed":
                continue
            out += self.declared(
                s,
                edge,
                event,
                _and(is_not_passed, f"{outcome} == {q(key)}", remain),
                {f"attempts:{s.id}": "{{ " + used + " }}"},
            )
        if s.auto_resume is not None:
            out.append(
                self.edge(
                    event,
                    _and(is_not_passed, remain, f"{used} >= {s.auto_resume}"),
                    f"{self.names[s.id]}-escalated",
                    {f"attempts:{s.id}": "{{ " + used + " }}"},
                )
            )
        out.append(
            self.edge(
                event,
                _and(is_not_passed, remain),
                self.names[s.id],
                {f"attempts:{s.id}": "{{ " + used + " }}"},
            )
        )
        out.append(
            self.edge(
                event,
                is_not_passed,
                "failed",
                {"reason": f"stage {s.id}: the last of {s.max_attempts} attempts did not pass"},
            )
        )
        return out

    def stage(self, s: Stage) -> None:
        name = self.names[s.id]
        base: Path = ("spec", "states", name)
        self.out.at(base, (self.d.index, "stages", s.index))
        evidence = ANSWERED
        action = self.action(s)
        on: list[dict[str, Any]] = [self.without_status(s)]
        # A wait: park the stage until its signal.
        on.append(
            self.edge(
                "task.completed",
                '"wait" in result',
                f"{name}-wait",
                {f"wait:{s.id}": "{{ result.wait }}", f"evidence:{s.id}": "{{ " + evidence + " }}"},
            )
        )
        passed = 'result.status == "passed"'
        if s.policies:
            on.append(
                self.edge(
                    "task.completed",
                    passed,
                    f"{name}-peers",
                    {f"evidence:{s.id}": "{{ " + evidence + " }}"},
                )
            )
        else:
            on += self.pass_route(s, "task.completed", passed, evidence)
        outcome = '("outcome" in result ? result.outcome : result.status)'
        on += self.not_passed(s, "task.completed", "result.status", outcome, name)
        self.states[name] = {"description": s.label, "actions": [action]}
        gate = self.gate(s)
        if gate is not None:
            self.states[name]["gate"] = gate
            if not self.gated:  # said once, at the first gate
                self.gated = True
                self.out.note(
                    (*base, "gate"),
                    "requiredEvidence: a passed checkpoint missing a key is refused "
                    "(workflow_evidence_incomplete; gate.checked in the log) and the stage "
                    "asked again without consuming an attempt",
                )
        self.states[name]["on"] = on
        if s.area:
            self.states[name]["x-area"] = s.area
        self.wait_state(s)
        if s.auto_resume is not None:
            self.escalation_state(s)
        if s.policies:
            self.peers(s)

    def without_status(self, s: Stage) -> dict[str, Any]:
        """A reply that is neither a wait nor a checkpoint with a ``status``: refused (the
        hub's tools refuse such a checkpoint) at no cost of an attempt, the reason recorded
        once per reply, and the stage asked again; the run's budget of such replies ends
        a coordinator that never sends one."""
        self.budgets[NO_STATUS] = NO_STATUS_LIMIT
        guard = '!("wait" in result) && !("status" in result)'
        return self.edge(
            "task.completed", guard, self.names[s.id], {"refused": no_status(s.id)}, [NO_STATUS]
        )

    def plain_keys(self, s: Stage) -> list[str]:
        """The stage's required keys that evidence strings satisfy (not the peer-reply
        ones, which only the peers' replies do)."""
        policy_keys = {normalize(p.key) for p in s.policies}
        return [k for k in s.evidence if normalize(k) not in policy_keys]

    def gate(self, s: Stage, answered: str = ANSWERED) -> dict[str, Any] | None:
        """The stage's evidence gate on a ``passed`` checkpoint (``answered``: the
        evidence it carries): every required key (but those only peer replies satisfy)
        non-empty in the checkpoint or in what the stage's wait call sent, the plan hash
        captured where ``requirePlanHash`` asks for it, and the reproduction not weakened
        (the oracle's key, when cited, with the value it was confirmed with)."""
        keys = self.plain_keys(s)
        requires: dict[str, Any] = dict.fromkeys(keys, True)
        sources = [context_ref(f"evidence:{s.id}"), answered]
        aliases = [  # the normalized spelling proves the key as written
            f"{q(normalize(key))} in {src} ? {{{q(key)}: {src}[{q(normalize(key))}]}} : {{}}"
            for key in keys
            if normalize(key) != key
            for src in sources
        ]
        evidence = [sources[0], *aliases, sources[1]]
        if s.id in self.d.require_plan:
            requires[PLAN_HASH] = True
            evidence.append(f"{{{q(PLAN_HASH)}: context.plan}}")
        if self.d.repro and self.d.repro[0] != s.id:
            key = q(self.d.repro[1])
            requires[REPRO] = True
            kept = (
                f"!({key} in {answered}) || context.repro == null"
                f" || {answered}[{key}] == context.repro"
            )
            evidence.append(f'{{{q(REPRO)}: ({kept}) ? "kept" : ""}}')
        if not requires:
            return None
        return {
            "requires": requires,
            "evidence": evidence,
            "when": '!("wait" in result) && "status" in result && result.status == "passed"',
        }

    def action(self, s: Stage) -> dict[str, Any]:
        """The request to the coordinator for one attempt of ``s``."""
        action_input: dict[str, Any] = {
            "run": "{{ run.id }}",
            "workflow": self.d.id,
            "stage": s.id,
            "label": s.label,
            "instructions": s.instructions,
            "requiredEvidence": s.evidence,
            "attempt": "{{ " + self.attempts(s) + " + 1 }}",
            "maxAttempts": s.max_attempts,
            "prompt": _prompt(self.d.prompt),
            "delivery": self.d.delivery,
        }
        if s.area:
            action_input["area"] = s.area
        action: dict[str, Any] = {
            "capability": capability(self.d.target),
            "input": action_input,
            "timeout": f"{self.d.ttl_ms or DEFAULT_TTL_MS}ms",
        }
        return action

    def escalation_state(self, s: Stage) -> None:
        """After ``autoResumeLimit`` attempts without passing: wait for the escalation signal."""
        name = self.names[s.id]
        self.states[f"{name}-escalated"] = {
            "type": "human_in_the_loop",
            "description": f"{s.id}: {s.auto_resume} attempts without passing; "
            f"waiting for {ESCALATION}",
            "timeout": {
                "after": WAIT,
                "goto": "failed",
                "set": {"reason": f"stage {s.id}: escalation not cleared"},
            },
            "on": [
                self.edge(signal_type(self.d.id, ESCALATION), None, name, {}),
                self.edge(SIGNAL_EVENT, f'data.signal == "{ESCALATION}"', name, {}),
            ],
        }

    def wait_state(self, s: Stage) -> None:
        """Park the stage until its signal: through the gateway (the key in the event type;
        a stage waits under its own id there) or sent to the run as ``kxm.signal`` (the key
        in ``data.signal``, any key the coordinator chose)."""
        name = self.names[s.id]
        on: list[dict[str, Any]] = []
        for event, key_test in (
            (signal_type(self.d.id, s.id), None),
            (SIGNAL_EVENT, f"data.signal == {context_ref('wait:' + s.id)}"),
        ):
            signal_key = q(s.id) if key_test is None else "data.signal"
            matches = _and(key_test, '"status" in data')
            route = [
                _matches_route("workflow.stage", q(s.id)),
                _matches_route("workflow.signal", signal_key),
                _matches_route("workflow.run", "run.id"),
            ]
            evidence = SIGNALLED
            passed = " && ".join(
                [str(matches), *[f"({r})" for r in route], 'data.status == "passed"']
            )
            if s.policies:
                # Peer-reply keys are for the peers alone: a passing signal asks them next.
                writes = {f"evidence:{s.id}": "{{ " + evidence + " }}"}
                on.append(self.edge(event, passed, f"{name}-peers", writes))
            else:
                on += self.pass_route(s, event, passed, evidence)
            outcome = '("outcome" in data ? data.outcome : data.status)'
            for entry in self.not_passed(s, event, "data.status", outcome, name):
                entry["guard"] = _and(matches, *[f"({r})" for r in route], entry.get("guard"))
                on.append(entry)
        self.states[f"{name}-wait"] = {
            "description": f"{s.id}: waiting for its signal",
            "timeout": {
                "after": WAIT,
                "goto": "failed",
                "set": {"reason": f"stage {s.id}: the wait expired"},
            },
            "on": on,
        }
        gate = self.gate(s, SIGNALLED)
        if gate is not None:
            # A passing signal for this wait is checked like a passing checkpoint; refused,
            # it is not taken (gate.checked records what it missed) and the stage waits on.
            mine = (
                f"event.type == {q(signal_type(self.d.id, s.id))} || "
                f'("signal" in data && data.signal == {context_ref("wait:" + s.id)})'
            )
            gate["when"] = f'({mine}) && "status" in data && data.status == "passed"'
            self.states[f"{name}-wait"]["gate"] = gate

    def peers(self, s: Stage) -> None:
        """Each evidence policy is a quorum of its eligible agents (one capability each, so
        their answers come from distinct producers), asked at once for this attempt, one
        policy after another; a quorum out of reach refuses the checkpoint."""
        name = self.names[s.id]
        states = [f"{name}-peers"] + [f"{name}-peers-{k + 1}" for k in range(1, len(s.policies))]
        for k, policy in enumerate(s.policies):
            actions = [
                {
                    "capability": capability(agent),
                    "input": {
                        "run": "{{ run.id }}",
                        "workflow": self.d.id,
                        "stage": s.id,
                        "requirement": policy.key,
                        "attempt": "{{ " + self.attempts(s) + " + 1 }}",
                        "evidence": "{{ " + context_ref(f"evidence:{s.id}") + " }}",
                    },
                }
                for agent in policy.agents
            ]
            if k + 1 < len(states):
                on = [self.edge("task.completed", None, states[k + 1], {})]
            else:
                on = self.pass_route(s, "task.completed", None, context_ref(f"evidence:{s.id}"))
            self.states[states[k]] = {
                "description": f"{s.id}: {policy.min_producers} peer replies for {policy.key}",
                "parallel": {
                    "completion": {"at_least": policy.min_producers},
                    "actions": actions,
                },
                "on": on,
                "catch": [
                    {
                        "errors": ["*"],
                        "codes": ["quorum_not_met"],
                        "goto": name,
                        "set": {"refused": short_of_peers(s.id, policy)},
                    }
                ],
            }


def _matches_route(key: str, expected: str) -> str:
    """A signal's ``workflow.*`` evidence, when present, must match the route."""
    return (
        f'!("evidence" in data) || !("{key}" in data.evidence)'
        f' || data.evidence["{key}"] == {expected}'
    )


def _evidence_value(evidence: str, key: str) -> str:
    spellings = sorted({key, normalize(key)})
    value = "null"
    for k in reversed(spellings):
        value = f"({q(k)} in {evidence} ? {evidence}[{q(k)}] : {value})"
    return value


def _and(*parts: str | None) -> str | None:
    present = [p for p in parts if p]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    return " && ".join(f"({p})" for p in present)
