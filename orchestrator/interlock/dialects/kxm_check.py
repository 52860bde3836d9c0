"""kxm webhook workflow definitions as the hub reads them: the records a definition is
made of (definitions, stages, evidence policies, transitions) and the hub's load-time rules,
checked with rule ids ``kxm.<rule>`` at their place in the JSON file. What the records
become is in :mod:`interlock.dialects.kxm_states` and :mod:`interlock.dialects.kxm`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.dialects.base import Checker

DIALECT = "kxm"
TERMINAL = "$terminal"
SOURCES = ("jira", "github", "generic")
AREAS = ("harness", "gates", "implementation", "workflow", "documentation", "security", "other")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


DEFAULT_TTL_MS = 86_400_000
"""A prompt's lifetime when a definition sets no ``ttlMs``: the hub's
``KXM_MESSAGE_TTL_MS`` default (24 hours)."""


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
    """``ttlMs`` as written (None: the hub's default, :data:`DEFAULT_TTL_MS`)."""
    budget: int | None = None
    plan_hash: tuple[str, str] | None = None
    repro: tuple[str, str] | None = None
    require_plan: list[str] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    secret_env: str | None = None
    signal_secret_env: str | None = None
    delivery: str = "followUp"


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
    stages = _stages(check, stages_raw, path, target)
    _check_edges(check, stages, budget)
    plan_hash = _oracle(check, item, "planHash", path, stages)
    repro = _oracle(check, item, "reproOracle", path, stages)
    require = _require_plan(check, item, path, stages, plan_hash)
    if None in (def_id, project, target, prompt):
        return None
    return Definition(
        str(def_id), i, str(source), str(project), str(target), str(prompt), event, flt, ttl,
        budget, plan_hash, repro, require, stages,
        item.get("secretEnv"), item.get("signalSecretEnv"),
        "steer" if item.get("delivery") == "steer" else "followUp",
    )  # fmt: skip


def _stages(check: Checker, listed: list[Any], path: Path, target: str | None) -> list[Stage]:
    """The definition's stages, each id once."""
    stages: list[Stage] = []
    ids: dict[str, int] = {}
    for j, raw_stage in enumerate(listed):
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
    return stages


def _check_edges(check: Checker, stages: list[Stage], budget: int | None) -> None:
    """Transitions go to a known stage, forward only to the next one, and back only under
    the definition's budget."""
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


def _require_plan(
    check: Checker,
    item: dict[str, Any],
    path: Path,
    stages: list[Stage],
    plan_hash: tuple[str, str] | None,
) -> list[str]:
    """The stages that need the plan hash recorded before they run."""
    order = {s.id for s in stages}
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
    return require


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
