"""kxm workflow definitions, loaded as written: the webhook workflow definitions (a JSON
array) and the Runtime workflow form (``schema: kxm.workflow.v1``, in :mod:`kxm_runtime`).

A webhook definition's stages become states of one native workflow, and what the hub
enforces becomes transitions and guards the engine evaluates:

- each attempt of a stage is one request to the coordinator (capability ``kxm.<target>``)
  whose answer is the checkpoint ``{status, summary, evidence, outcome, wait}``; a stage
  passes on ``passed`` with every required evidence key non-empty;
- a ``passed`` checkpoint missing a key is **refused without consuming an attempt** (the
  stage is asked again, the attempt count unchanged); ``warning``/``failed`` consume one;
  the last attempt that does not pass fails the run; ``autoResumeLimit`` escalates to a wait
  for the ``audit_escalation`` signal;
- peer-reply evidence policies ask every eligible agent (capability ``kxm.<agent>``, one per
  agent, so producers are distinct) at once, for that attempt, and pass only with at least
  ``minProducers`` replies;
- ``on`` transitions, forward-only targets, back-edges and the three transition budgets
  (edge, stage, definition; only declared transitions count) are guards over counters in
  the run's context; an exhausted budget fails the run (``transition_budget_exhausted``);
- a checkpoint with ``wait`` parks the stage until its signal: through the HTTP gateway
  (each definition implies a ``kind: Webhook``: starts are ``kxm.<id>.<event>``, signals
  ``kxm.<id>.signal.<key>``) or a ``kxm.signal`` event naming its key; a wait expires after
  24 hours and fails the run.

The hub's load-time rules are checked with rule ids ``kxm.<rule>``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.dialects.base import API_VERSION, Checker, Lowered, Lowering, agent_def

DIALECT = "kxm"
TERMINAL = "$terminal"
SOURCES = ("jira", "github", "generic")
AREAS = ("harness", "gates", "implementation", "workflow", "documentation", "security", "other")
SIGNAL_EVENT = "kxm.signal"
"""A signal sent straight to a run (``interlock signal``): ``data.signal`` names its key."""
EVENT_HEADERS = {"jira": ("field", "webhookEvent"), "github": ("header", "X-GitHub-Event")}
"""Where each source's deliveries name their event; a generic sender uses ``X-KXM-Event``."""
_NOT_IN_TYPE = re.compile(r"[^A-Za-z0-9_.-]")


def start_type(definition_id: str, event: str | None) -> str:
    """The CloudEvent type of a delivery that starts a run: ``kxm.<id>.<event>`` (the
    event as the gateway writes it into a type), or ``kxm.<id>.delivery`` without one."""
    suffix = _NOT_IN_TYPE.sub("_", event).strip(".") if event else "delivery"
    return f"kxm.{_dns(definition_id)}.{suffix}"


def signal_type(definition_id: str, key: str) -> str:
    """The CloudEvent type of a signal through the gateway: ``kxm.<id>.signal.<key>``."""
    return f"kxm.{_dns(definition_id)}.signal.{_NOT_IN_TYPE.sub('_', key).strip('.')}"


ESCALATION = "audit_escalation"
WAIT = "24h"
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_.:-]+)\s*\}\}")


def detect(data: Any) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(d, dict) and "stages" in d for d in data)
    )


def normalize(key: str) -> str:
    """kxm compares evidence keys trimmed, inner whitespace collapsed, lowercased."""
    return " ".join(key.split()).lower()


@dataclass(slots=True)
class Edge:
    outcome: str
    target: str  # a stage id or $terminal
    budget: int | None
    path: Path


@dataclass(slots=True)
class Policy:
    key: str
    min_producers: int
    agents: list[str]


@dataclass(slots=True)
class Stage:
    id: str
    index: int
    label: str
    instructions: str
    evidence: list[str]
    max_attempts: int = 3
    auto_resume: int | None = None
    area: str | None = None
    policies: list[Policy] = field(default_factory=list)
    on: dict[str, Edge] = field(default_factory=dict)
    budget: int | None = None


@dataclass(slots=True)
class Definition:
    id: str
    index: int
    source: str
    project: str
    target: str
    prompt: str
    event: str | None = None
    filter: tuple[str, str] | None = None
    ttl_ms: int | None = None
    budget: int | None = None
    plan_hash: tuple[str, str] | None = None
    repro: tuple[str, str] | None = None
    require_plan: list[str] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    secret_env: str | None = None
    signal_secret_env: str | None = None


# --- checks ---------------------------------------------------------------------------------


def parse(src: Document, diags: list[Diagnostic]) -> list[Definition] | None:
    check = Checker(src, DIALECT, diags)
    before = len(diags)
    data = src.data
    if not isinstance(data, list):
        check.error((), "wrong-type", "webhook workflow definitions are a JSON array")
        return None
    out: list[Definition] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        path: Path = (i,)
        if check.mapping(item, path, "a definition") is None:
            continue
        definition = _definition(check, item, i, path)
        if definition is None:
            continue
        if definition.id in seen:
            check.error((*path, "id"), "duplicate-id", f"definition id {definition.id!r} twice")
            continue
        seen.add(definition.id)
        out.append(definition)
    return out if len(diags) == before else None


def _definition(check: Checker, item: dict[str, Any], i: int, path: Path) -> Definition | None:
    def_id = check.string(item, "id", path, required=True, min_len=1, max_len=64)
    source = item.get("source", "generic")
    if source not in SOURCES:
        check.error((*path, "source"), "invalid-value", "source must be jira, github or generic")
    project = check.string(item, "project", path, required=True, min_len=1, max_len=128)
    target = check.string(item, "target", path, required=True, min_len=1, max_len=80)
    has_env, has_secret = "secretEnv" in item, "secret" in item
    if has_env == has_secret:
        check.error(path, "secret", "exactly one of secretEnv and secret")
    for env in ("secretEnv", "signalSecretEnv"):
        check.string(item, env, path, pattern=_ENV, form="an environment variable name")
    for key in ("secret", "signalSecret"):
        check.string(item, key, path, min_len=16, max_len=512)
    if "signalSecretEnv" in item and "signalSecret" in item:
        check.error(path, "secret", "at most one of signalSecretEnv and signalSecret")
    event = check.string(item, "event", path, min_len=1, max_len=128)
    flt: tuple[str, str] | None = None
    if "filter" in item:
        spec = check.mapping(item["filter"], (*path, "filter"), "filter")
        if spec is not None:
            fpath = check.string(spec, "path", (*path, "filter"), required=True, max_len=256)
            equals = check.string(spec, "equals", (*path, "filter"), required=True, max_len=512)
            if fpath is not None and equals is not None:
                flt = (fpath, equals)
    if "delivery" in item and item["delivery"] not in ("followUp", "steer"):
        check.error((*path, "delivery"), "invalid-value", "delivery must be followUp or steer")
    ttl = check.integer(item, "ttlMs", path, lo=1000, hi=604_800_000)
    prompt = check.string(item, "promptTemplate", path, required=True, max_len=20_000)
    budget = check.integer(item, "maxTransitions", path, lo=1, hi=200)
    raw = item.get("stages")
    if raw is None:
        check.error(path, "missing-field", "missing required field 'stages'")
        return None
    stages_raw = check.items(raw, (*path, "stages"), "stages")
    if stages_raw is None:
        return None
    if not 1 <= len(stages_raw) <= 32:
        check.error((*path, "stages"), "invalid-value", "a definition has 1 to 32 stages")
    stages: list[Stage] = []
    ids: dict[str, int] = {}
    for j, raw_stage in enumerate(stages_raw):
        spath: Path = (*path, "stages", j)
        if check.mapping(raw_stage, spath, "a stage") is None:
            continue
        stage = _stage(check, raw_stage, j, spath, target)
        if stage is None:
            continue
        if stage.id in ids:
            check.error((*spath, "id"), "duplicate-stage", f"stage id {stage.id!r} twice")
            continue
        ids[stage.id] = j
        stages.append(stage)
    order = {s.id: k for k, s in enumerate(stages)}
    for k, stage in enumerate(stages):
        for edge in stage.on.values():
            if edge.target == TERMINAL:
                continue
            if edge.target not in order:
                check.error(
                    edge.path, "unknown-stage", f"transition to unknown stage {edge.target!r}"
                )
            elif order[edge.target] > k + 1:
                check.error(
                    edge.path,
                    "forward-target",
                    f"{stage.id} may go forward only to the next stage "
                    f"({stages[k + 1].id if k + 1 < len(stages) else TERMINAL}), "
                    f"not {edge.target!r}",
                )
            elif order[edge.target] <= k and budget is None:
                check.error(
                    edge.path,
                    "back-edge-budget",
                    f"the back-edge {stage.id} -> {edge.target} needs the "
                    "definition's maxTransitions",
                )
    plan_hash = _oracle(check, item, "planHash", path, stages)
    repro = _oracle(check, item, "reproOracle", path, stages)
    require: list[str] = []
    if "requirePlanHash" in item:
        listed = check.items(item["requirePlanHash"], (*path, "requirePlanHash"), "requirePlanHash")
        for k, stage_id in enumerate(listed or []):
            if not isinstance(stage_id, str) or stage_id not in order:
                check.error(
                    (*path, "requirePlanHash", k), "unknown-stage", f"unknown stage {stage_id!r}"
                )
            else:
                require.append(stage_id)
        if require and plan_hash is None:
            check.error((*path, "requirePlanHash"), "plan-hash", "requirePlanHash needs planHash")
    if None in (def_id, project, target, prompt):
        return None
    return Definition(
        str(def_id), i, str(source), str(project), str(target), str(prompt), event, flt, ttl,
        budget, plan_hash, repro, require, stages,
        item.get("secretEnv"), item.get("signalSecretEnv"),
    )  # fmt: skip


def _oracle(
    check: Checker, item: dict[str, Any], key: str, path: Path, stages: list[Stage]
) -> tuple[str, str] | None:
    if key not in item:
        return None
    spec = check.mapping(item[key], (*path, key), key)
    if spec is None:
        return None
    stage_id = check.string(spec, "stageId", (*path, key), required=True)
    evidence = check.string(spec, "evidenceKey", (*path, key), required=True)
    if stage_id is None or evidence is None:
        return None
    stage = next((s for s in stages if s.id == stage_id), None)
    if stage is None:
        check.error((*path, key, "stageId"), "unknown-stage", f"unknown stage {stage_id!r}")
        return None
    if normalize(evidence) not in {normalize(e) for e in stage.evidence}:
        check.error(
            (*path, key, "evidenceKey"),
            "unknown-evidence",
            f"{evidence!r} is not required evidence of stage {stage_id!r}",
        )
    return stage_id, evidence


def _stage(
    check: Checker, raw: dict[str, Any], j: int, path: Path, target: str | None
) -> Stage | None:
    stage_id = check.string(raw, "id", path, required=True, min_len=1, max_len=64)
    label = check.string(raw, "label", path, max_len=128)
    instructions = check.string(raw, "instructions", path, required=True, max_len=4000)
    evidence: list[str] = []
    if "requiredEvidence" in raw:
        listed = check.items(
            raw["requiredEvidence"], (*path, "requiredEvidence"), "requiredEvidence"
        )
        normalized: set[str] = set()
        for k, key in enumerate(listed or []):
            epath: Path = (*path, "requiredEvidence", k)
            if not isinstance(key, str) or not key.strip() or len(key) > 128:
                check.error(epath, "invalid-value", "an evidence key is 1 to 128 characters")
                continue
            if normalize(key) in normalized:
                check.error(epath, "duplicate-evidence", f"evidence key {key!r} twice (normalized)")
                continue
            normalized.add(normalize(key))
            evidence.append(key)
        if len(evidence) > 32:
            check.error((*path, "requiredEvidence"), "invalid-value", "at most 32 evidence keys")
    attempts = check.integer(raw, "maxAttempts", path, lo=1, hi=20)
    resume = check.integer(raw, "autoResumeLimit", path, lo=1, hi=20)
    if "area" in raw and raw["area"] not in AREAS:
        check.error((*path, "area"), "invalid-value", f"area must be one of {', '.join(AREAS)}")
    budget = check.integer(raw, "maxTransitions", path, lo=1, hi=100)
    policies: list[Policy] = []
    if "evidencePolicies" in raw:
        spec = check.mapping(
            raw["evidencePolicies"], (*path, "evidencePolicies"), "evidencePolicies"
        )
        for key, value in (spec or {}).items():
            ppath: Path = (*path, "evidencePolicies", key)
            policy = _policy(check, key, value, ppath, target)
            if policy is None:
                continue
            if normalize(key) not in {normalize(e) for e in evidence}:
                check.error(
                    ppath, "policy-key", f"policy key {key!r} is not in requiredEvidence", key=True
                )
                continue
            policies.append(policy)
    on: dict[str, Edge] = {}
    if "on" in raw:
        spec = check.mapping(raw["on"], (*path, "on"), "on")
        for outcome, value in (spec or {}).items():
            opath: Path = (*path, "on", outcome)
            if isinstance(value, str):
                on[outcome] = Edge(outcome, value, None, opath)
            elif isinstance(value, dict):
                edge_target = check.string(value, "target", opath, required=True)
                edge_budget = check.integer(value, "maxTransitions", opath, lo=1, hi=100)
                if edge_target is not None:
                    on[outcome] = Edge(outcome, edge_target, edge_budget, opath)
            else:
                check.error(
                    opath,
                    "wrong-type",
                    "a transition is a stage id, $terminal or {target, maxTransitions}",
                )
    if stage_id is None or instructions is None:
        return None
    return Stage(
        stage_id, j, label or stage_id, instructions, evidence, attempts or 3, resume,
        raw.get("area"), policies, on, budget,
    )  # fmt: skip


def _policy(check: Checker, key: str, value: Any, path: Path, target: str | None) -> Policy | None:
    spec = check.mapping(value, path, "an evidence policy")
    if spec is None:
        return None
    allowed = {"kind", "minProducers", "eligibleAgents", "acceptedStatuses", "degradation"}
    check.unknown_keys(spec, allowed, path, "an evidence policy")
    if spec.get("kind") != "peer-reply":
        check.error(
            (*path, "kind") if "kind" in spec else path, "invalid-value", "kind must be peer-reply"
        )
    minimum = check.integer(spec, "minProducers", path, lo=1, hi=8, required=True)
    agents = check.items(spec.get("eligibleAgents"), (*path, "eligibleAgents"), "eligibleAgents")
    if agents is None:
        return None
    if not 1 <= len(agents) <= 16 or len(set(map(str, agents))) != len(agents):
        check.error((*path, "eligibleAgents"), "invalid-value", "1 to 16 unique agents")
    if target is not None and target in agents:
        check.error(
            (*path, "eligibleAgents"), "invalid-value", "eligibleAgents must not include the target"
        )
    if minimum is not None and minimum > len(agents):
        check.error(
            (*path, "minProducers"),
            "invalid-value",
            "minProducers is more than the eligible agents",
        )
    if "acceptedStatuses" in spec and spec["acceptedStatuses"] != ["replied"]:
        check.error(
            (*path, "acceptedStatuses"),
            "invalid-value",
            'acceptedStatuses must be exactly ["replied"]',
        )
    if "degradation" in spec:
        degradation = (
            check.mapping(spec["degradation"], (*path, "degradation"), "degradation") or {}
        )
        check.unknown_keys(degradation, {"minProducers"}, (*path, "degradation"), "degradation")
        lowest = check.integer(
            degradation, "minProducers", (*path, "degradation"), lo=1, required=True
        )
        if lowest is not None and minimum is not None and lowest >= minimum:
            check.error(
                (*path, "degradation", "minProducers"),
                "invalid-value",
                "degradation.minProducers must be lower than minProducers",
            )
    if minimum is None or not all(isinstance(a, str) for a in agents):
        return None
    return Policy(key, minimum, [str(a) for a in agents])


# --- lowering -------------------------------------------------------------------------------


def _q(text: str) -> str:
    return json.dumps(text)


def _ctx(key: str) -> str:
    return f"context[{_q(key)}]"


def _capability(name: str) -> str:
    return "kxm." + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "agent")


def _dns(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-") or "kxm"


def _state(stage: Stage) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", stage.id)
    return name if name[:1].isalpha() else f"s_{name}"


def _prompt(template: str) -> str:
    """``{{dotted.path}}`` from the payload (the run's inputs); a missing value is empty."""

    def each(match: re.Match[str]) -> str:
        parts = match.group(1).split(".")
        tests = []
        for n in range(len(parts)):
            parent = "inputs" + "".join(f"[{_q(p)}]" for p in parts[:n])
            tests.append(f"{_q(parts[n])} in {parent}")
        value = "inputs" + "".join(f"[{_q(p)}]" for p in parts)
        return "{{ " + f'({" && ".join(tests)}) ? {value} : ""' + " }}"

    return _PLACEHOLDER.sub(each, template)


def _has(evidence: str, keys: list[str], *also: str) -> str:
    """CEL: every key is a non-empty string in ``evidence`` (or in one of ``also``)."""
    clauses = []
    for key in keys:
        spellings = sorted({key, normalize(key)})
        sources = [evidence, *also]
        options = [
            f'({_q(k)} in {src} && {src}[{_q(k)}] != "")' for src in sources for k in spellings
        ]
        clauses.append("(" + " || ".join(options) + ")")
    return " && ".join(clauses) if clauses else "true"


class _Lower:
    def __init__(self, definition: Definition, out: Lowering) -> None:
        self.d = definition
        self.out = out
        self.states: dict[str, Any] = {}
        self.names = {s.id: _state(s) for s in definition.stages}
        self.ids = {s.id: k for k, s in enumerate(definition.stages)}

    # counters and statuses in the context
    def attempts(self, s: Stage) -> str:
        return _ctx(f"attempts:{s.id}")

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
            cond = f'{_ctx("status:" + other.id)} != "passed"'
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
        self, event: str, guard: str | None, goto: str, writes: dict[str, Any]
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"event": event}
        if guard:
            entry["guard"] = guard
        entry["goto"] = goto
        if writes:
            entry["set"] = writes
        return entry

    def declared(
        self, s: Stage, edge: Edge, event: str, guard: str | None, writes: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """A declared transition, with the budgets it counts against."""
        counters = [
            ("transitions", self.d.budget),
            (f"transitions:{s.id}", s.budget),
            (f"edge:{s.id}:{edge.outcome}", edge.budget),
        ]
        within = [f"{_ctx(k)} < {n}" for k, n in counters if n is not None]
        bump = {k: "{{ " + _ctx(k) + " + 1 }}" for k, _ in counters}
        if edge.target == TERMINAL:
            goto, extra = "completed", {}
        else:
            target = self.d.stages[self.ids[edge.target]]
            goto, extra = self.names[target.id], self.reset(target)
            if edge.outcome != "passed":
                extra[f"status:{s.id}"] = "pending"
        out = [self.edge(event, _and(guard, *within), goto, {**writes, **bump, **extra})]
        if within:
            reason = f"transition_budget_exhausted: {s.id} -> {edge.target} ({edge.outcome})"
            out.append(self.edge(event, guard, "failed", {"reason": reason}))
        return out

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
                _and(is_not_passed, f"{outcome} == {_q(key)}", remain),
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
        evidence = "result.evidence"
        has_evidence = '"evidence" in result'
        complete = _has(
            evidence,
            [k for k in s.evidence if normalize(k) not in {normalize(p.key) for p in s.policies}],
            _ctx(f"evidence:{s.id}"),
        )
        gates = ['result.status == "passed"', has_evidence, complete]
        refused_why = []
        if s.id in self.d.require_plan:
            gates.append("context.plan != null")
            refused_why.append("plan_hash_required")
        if self.d.repro and self.d.repro[0] != s.id:
            key = self.d.repro[1]
            gates.append(
                f"(!({_q(key)} in result.evidence) || context.repro == null"
                f" || result.evidence[{_q(key)}] == context.repro)"
            )
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
        }
        if s.area:
            action_input["area"] = s.area
        action: dict[str, Any] = {"capability": _capability(self.d.target), "input": action_input}
        if self.d.ttl_ms:
            action["timeout"] = f"{self.d.ttl_ms}ms"
        on: list[dict[str, Any]] = []
        # A wait: park the stage until its signal.
        on.append(
            self.edge(
                "task.completed",
                '"wait" in result',
                f"{name}-wait",
                {
                    f"wait:{s.id}": "{{ result.wait }}",
                    f"evidence:{s.id}": "{{ " + has_evidence + " ? result.evidence : {} }}",
                },
            )
        )
        passed = " && ".join(gates)
        if s.policies:
            on.append(
                self.edge(
                    "task.completed",
                    passed,
                    f"{name}-peers",
                    {f"evidence:{s.id}": "{{ result.evidence }}"},
                )
            )
        else:
            on += self.pass_route(s, "task.completed", passed, evidence)
        # Refused: a passed checkpoint missing evidence consumes no attempt.
        on.append(
            self.edge(
                "task.completed",
                'result.status == "passed"',
                name,
                {"refused": f"stage {s.id}: workflow_evidence_incomplete"},
            )
        )
        outcome = '("outcome" in result ? result.outcome : result.status)'
        on += self.not_passed(s, "task.completed", "result.status", outcome, name)
        self.states[name] = {"description": s.label, "actions": [action], "on": on}
        if s.area:
            self.states[name]["x-area"] = s.area
        self.wait_state(s)
        if s.auto_resume is not None:
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
        if s.policies:
            self.peers(s)

    def wait_state(self, s: Stage) -> None:
        """Park the stage until its signal: through the gateway (the key in the event type;
        a stage waits under its own id there) or sent to the run as ``kxm.signal`` (the key
        in ``data.signal``, any key the coordinator chose)."""
        name = self.names[s.id]
        on: list[dict[str, Any]] = []
        for event, key_test in (
            (signal_type(self.d.id, s.id), None),
            (SIGNAL_EVENT, f"data.signal == {_ctx('wait:' + s.id)}"),
        ):
            signal_key = _q(s.id) if key_test is None else "data.signal"
            matches = _and(key_test, '"status" in data')
            route = [
                _matches_route("workflow.stage", _q(s.id)),
                _matches_route("workflow.signal", signal_key),
                _matches_route("workflow.run", "run.id"),
            ]
            evidence = '("evidence" in data ? data.evidence : {})'
            complete = _has(evidence, s.evidence, _ctx(f"evidence:{s.id}"))
            passed = " && ".join(
                [str(matches), *[f"({r})" for r in route], 'data.status == "passed"', complete]
            )
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

    def peers(self, s: Stage) -> None:
        name = self.names[s.id]
        actions: list[dict[str, Any]] = []
        counts = []
        for policy in s.policies:
            first = len(actions)
            for agent in policy.agents:
                actions.append(
                    {
                        "capability": _capability(agent),
                        "input": {
                            "run": "{{ run.id }}",
                            "workflow": self.d.id,
                            "stage": s.id,
                            "requirement": policy.key,
                            "attempt": "{{ " + self.attempts(s) + " + 1 }}",
                            "evidence": "{{ " + _ctx(f"evidence:{s.id}") + " }}",
                        },
                    }
                )
            items = ", ".join(f"result[{k}]" for k in range(first, len(actions)))
            counts.append(
                f'[{items}].filter(r, r.status == "completed").size() >= {policy.min_producers}'
            )
        quorum = " && ".join(counts)
        on = self.pass_route(s, "task.completed", quorum, _ctx(f"evidence:{s.id}"))
        on.append(
            self.edge(
                "task.completed", None, name, {"refused": f"stage {s.id}: too few peer replies"}
            )
        )
        self.states[f"{name}-peers"] = {
            "description": f"{s.id}: peer replies for " + ", ".join(p.key for p in s.policies),
            "parallel": {"completion": "all_settled", "actions": actions},
            "on": on,
        }


def _matches_route(key: str, expected: str) -> str:
    """A signal's ``workflow.*`` evidence, when present, must match the route."""
    return (
        f'!("evidence" in data) || !("{key}" in data.evidence)'
        f' || data.evidence["{key}"] == {expected}'
    )


def _webhook(d: Definition, out: Lowering) -> dict[str, Any] | None:
    """The gateway's ``kind: Webhook`` for a definition: POST /webhooks/<id>, signed."""
    name = _dns(d.id)
    if d.secret_env is None:
        out.note(
            ("metadata",),
            f"{d.id}: an inline secret cannot go into a Webhook (secrets are read from the "
            "environment or a file): no Webhook is implied; write one with secret: {env: ...}",
        )
        return None
    prefix = f"kxm.{name}."
    if d.event is None:
        event_type: dict[str, Any] = {"value": "delivery", "prefix": prefix}
    else:
        where, key = EVENT_HEADERS.get(d.source, ("header", "X-KXM-Event"))
        event_type = {where: key, "prefix": prefix}
    spec: dict[str, Any] = {
        "scheme": "standard" if d.source == "generic" else "github",
        "secret": {"env": d.secret_env},
        "source": f"kxm://{_dns(d.project)}/{name}",
        "type": event_type,
    }
    if d.source == "jira":
        spec["signature_header"] = "X-Hub-Signature"
        spec["id"] = {"header": "X-Atlassian-Webhook-Identifier"}
    signals: dict[str, Any] = {"prefix": f"{prefix}signal."}
    if d.signal_secret_env:
        signals["secret"] = {"env": d.signal_secret_env}
    spec["signals"] = signals
    spec["description"] = f"kxm webhook workflow definition {d.id} (project {d.project})"
    return {
        "apiVersion": API_VERSION,
        "kind": "Webhook",
        "metadata": {"name": name},
        "spec": spec,
    }


def _evidence_value(evidence: str, key: str) -> str:
    spellings = sorted({key, normalize(key)})
    value = "null"
    for k in reversed(spellings):
        value = f"({_q(k)} in {evidence} ? {evidence}[{_q(k)}] : {value})"
    return value


def _and(*parts: str | None) -> str | None:
    present = [p for p in parts if p]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    return " && ".join(f"({p})" for p in present)


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    definitions = parse(src, diags)
    if definitions is None:
        return None
    lowered = Lowered(DIALECT, src)
    capabilities: list[str] = []
    for d in definitions:
        out = Lowering(src, DIALECT)
        low = _Lower(d, out)
        for stage in d.stages:
            low.stage(stage)
            for cap in [
                _capability(d.target),
                *(_capability(a) for p in stage.policies for a in p.agents),
            ]:
                if cap not in capabilities:
                    capabilities.append(cap)
        low.states["completed"] = {
            "type": "terminal",
            "outputs": {
                "status": "completed",
                "stages": {s.id: "{{ " + _ctx(f"status:{s.id}") + " }}" for s in d.stages},
                "evidence": {s.id: "{{ " + _ctx(f"evidence:{s.id}") + " }}" for s in d.stages},
            },
        }
        low.states["failed"] = {
            "type": "terminal",
            "fail": {"message": "{{ context.reason }}"},
            "outputs": {"status": "failed", "reason": "{{ context.reason }}"},
        }
        context: dict[str, Any] = {
            "kxm": {"source": d.source, "project": d.project},
            "reason": "",
            "refused": "",
            "plan": None,
            "repro": None,
            "transitions": 0,
        }
        for k, s in enumerate(d.stages):
            context[f"attempts:{s.id}"] = 0
            context[f"status:{s.id}"] = "in_progress" if k == 0 else "pending"
            context[f"evidence:{s.id}"] = {}
            context[f"wait:{s.id}"] = ""
            context[f"transitions:{s.id}"] = 0
            for edge in s.on.values():
                context[f"edge:{s.id}:{edge.outcome}"] = 0
        trigger: dict[str, Any] = {"event": start_type(d.id, d.event)}
        if d.filter:
            trigger["filter"] = {d.filter[0]: d.filter[1]}
        name = _dns(d.id)
        out.at(("metadata",), (d.index, "id"))
        out.at(("spec", "triggers"), (d.index,))
        if name != d.id:
            out.note(("metadata", "name"), f"id {d.id!r} -> {name} (a DNS label)")
        out.note(
            ("spec", "triggers"),
            f"a signed POST /webhooks/{name} (the Webhook below, checked by the gateway) "
            f"arrives as a CloudEvent {trigger['event']} whose data is the payload: the run's "
            "inputs; a delivery of another event has another type and starts nothing",
        )
        out.note(
            ("spec", "context"),
            "the hub's bookkeeping, kept in the run: attempts, status and evidence per stage, the "
            "signal key a stage waits for, and the transition counters the budgets read",
        )
        out.note(
            ("spec", "budget"),
            "every attempt, refusal and wait is a transition here; kxm's maxTransitions budgets "
            "(declared transitions only) are the guards on the context counters",
        )
        native = {
            "apiVersion": API_VERSION,
            "kind": "Workflow",
            "metadata": {
                "name": name,
                "labels": {"project": _dns(d.project)},
                "annotations": {"kxm.id": d.id, "kxm.project": d.project},
            },
            "spec": {
                "context": context,
                "triggers": [trigger],
                "budget": {"max_transitions": 2000, "max_actions": 2000, "max_fan_out": 64},
                "initial_state": low.names[d.stages[0].id],
                "states": low.states,
            },
        }
        lowered.workflows.append(out.finish(native, lowered))
        hook = Lowering(src, DIALECT)
        hook.at((), (d.index,))
        webhook = _webhook(d, hook)
        if webhook is not None:
            hook.note(
                ("spec", "scheme"),
                "jira and github sign the body (HMAC-SHA256); a generic sender's KXM contract "
                "binds a timestamp and a delivery id, as the Standard Webhooks scheme does",
            )
            hook.note(
                ("spec", "signals"),
                f"POST /webhooks/{_dns(d.id)}/runs/<run>/signals/<key>: a stage waiting under "
                "its own id takes the signal; any other key can be sent to the run as a "
                "kxm.signal event naming it (data.signal)",
            )
            lowered.workflows.append(hook.finish(webhook, lowered))
    agent = Lowering(src, DIALECT)
    agent.note(
        ("metadata",),
        "implied by the definitions: the coordinator (target) and every eligible peer, "
        "one capability each",
    )
    lowered.agents.append(
        agent.finish(
            agent_def("kxm-agents", ((c, f"kxm agent {c[4:]}") for c in capabilities)),
            lowered,
        )
    )
    return lowered
