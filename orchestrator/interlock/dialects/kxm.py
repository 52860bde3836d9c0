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
  agent) at once, for that attempt, as a quorum (``completion: {at_least: minProducers}``
  of distinct producers); a quorum out of reach refuses the checkpoint;
- ``on`` transitions, forward-only targets and back-edges are transitions; the three
  transition budgets (edge, stage, definition; only declared transitions count) are edge
  budgets (``spec.budget.edges``) the declared transitions count against; an exhausted
  budget fails the run (``budget_exceeded``);
- a checkpoint with ``wait`` parks the stage until its signal: through the HTTP gateway
  (each definition implies a ``kind: Webhook``: starts are ``kxm.<id>.<event>``, signals
  ``kxm.<id>.signal.<key>``) or a ``kxm.signal`` event naming its key; a wait expires after
  24 hours and fails the run.

The hub's load-time rules are checked with rule ids ``kxm.<rule>``.
"""

from __future__ import annotations

from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document
from interlock.dialects.base import API_VERSION, Lowered, Lowering, agent_def
from interlock.dialects.kxm_check import DIALECT, Definition, parse
from interlock.dialects.kxm_states import (
    StageLowering,
    capability,
    context_ref,
    dns_label,
    start_type,
)

EVENT_HEADERS = {"jira": ("field", "webhookEvent"), "github": ("header", "X-GitHub-Event")}
"""Where each source's deliveries name their event; a generic sender uses ``X-KXM-Event``."""


def detect(data: Any) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(d, dict) and "stages" in d for d in data)
    )


def _webhook(d: Definition, out: Lowering) -> dict[str, Any] | None:
    """The gateway's ``kind: Webhook`` for a definition: POST /webhooks/<id>, signed."""
    name = dns_label(d.id)
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
        if where == "header":  # not signed: pinned to the one event the definition takes
            event_type["values"] = [d.event]
    spec: dict[str, Any] = {
        "scheme": "standard" if d.source == "generic" else "github",
        "secret": {"env": d.secret_env},
        "source": f"kxm://{dns_label(d.project)}/{name}",
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


def _degradation_warnings(src: Document) -> list[Diagnostic]:
    """A warning per degraded minimum (kxm's own validation warns of each too): it is
    checked, not applied, so the stage still needs ``minProducers`` distinct producers."""
    out = []
    for i, d in enumerate(src.data):
        for j, stage in enumerate(d.get("stages") or []):
            policies = stage.get("evidencePolicies") if isinstance(stage, dict) else None
            for key, policy in (policies if isinstance(policies, dict) else {}).items():
                if not isinstance(policy, dict) or not isinstance(policy.get("degradation"), dict):
                    continue
                lowest = policy["degradation"].get("minProducers")
                out.append(
                    src.diag(
                        (i, "stages", j, "evidencePolicies", key, "degradation", "minProducers"),
                        f"{DIALECT}.degraded-minimum",
                        f"stage {stage.get('id')!r}: the degraded minimum of {lowest} for "
                        f"{key!r} is checked, not applied: the stage needs minProducers "
                        f"({policy.get('minProducers')}) distinct producers",
                    )
                )
    return out


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    definitions = parse(src, diags)
    if definitions is None:
        return None
    lowered = Lowered(DIALECT, src, warnings=_degradation_warnings(src))
    capabilities: list[str] = []
    for d in definitions:
        lowered.workflows.append(_workflow(src, d, lowered, capabilities))
        hook = _hook(src, d, lowered)
        if hook is not None:
            lowered.workflows.append(hook)
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


def _workflow(src: Document, d: Definition, lowered: Lowered, capabilities: list[str]) -> Document:
    """The native workflow of one definition; ``capabilities`` gets the ones it requests."""
    out = Lowering(src, DIALECT)
    low = StageLowering(d, out)
    entered = _entered(d)
    for stage in d.stages:
        if stage.id not in entered:
            lowered.warnings.append(
                src.diag(
                    (d.index, "stages", stage.index, "id"),
                    f"{DIALECT}.unreachable-stage",
                    f"stage {stage.id!r} is never entered: no transition of a stage a run "
                    "enters leads to it (the hub loads it and never runs it); it is left out",
                )
            )
            continue
        low.stage(stage)
        for cap in [
            capability(d.target),
            *(capability(a) for p in stage.policies for a in p.agents),
        ]:
            if cap not in capabilities:
                capabilities.append(cap)
    low.states["completed"] = {
        "type": "terminal",
        "outputs": {
            "status": "completed",
            "stages": {s.id: "{{ " + context_ref(f"status:{s.id}") + " }}" for s in d.stages},
            "evidence": {s.id: "{{ " + context_ref(f"evidence:{s.id}") + " }}" for s in d.stages},
        },
    }
    low.states["failed"] = {
        "type": "terminal",
        "fail": {"message": "{{ context.reason }}"},
        "outputs": {"status": "failed", "reason": "{{ context.reason }}"},
    }
    trigger: dict[str, Any] = {"event": start_type(d.id, d.event)}
    if d.filter:
        trigger["filter"] = {d.filter[0]: d.filter[1]}
    name = dns_label(d.id)
    _notes(out, d, name, trigger["event"])
    native = {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "labels": {"project": dns_label(d.project)},
            "annotations": {"kxm.id": d.id, "kxm.project": d.project},
        },
        "spec": {
            "context": _context(d),
            "triggers": [trigger],
            "budget": _budget(low.budgets),
            "initial_state": low.names[d.stages[0].id],
            "states": low.states,
        },
    }
    return out.finish(native, lowered)


def _entered(d: Definition) -> set[str]:
    """The stages a run can enter: the first, and from each one entered, its declared
    targets, or, without a declared ``passed`` edge, any stage still pending (the hub's
    default edge); a failure without an edge retries the same stage."""
    entered = {d.stages[0].id}
    todo = [d.stages[0]]
    by_id = {s.id: s for s in d.stages}
    while todo:
        stage = todo.pop()
        targets = [e.target for e in stage.on.values() if e.target in by_id]
        if "passed" not in stage.on:
            targets = list(by_id)
        for target in targets:
            if target not in entered:
                entered.add(target)
                todo.append(by_id[target])
    return entered


def _context(d: Definition) -> dict[str, Any]:
    """The hub's bookkeeping for one run, as the workflow's initial context."""
    context: dict[str, Any] = {
        "kxm": {"source": d.source, "project": d.project},
        "reason": "",
        "refused": "",
        "plan": None,
        "repro": None,
    }
    for k, s in enumerate(d.stages):
        context[f"attempts:{s.id}"] = 0
        context[f"status:{s.id}"] = "in_progress" if k == 0 else "pending"
        context[f"evidence:{s.id}"] = {}
        context[f"wait:{s.id}"] = ""
    return context


def _budget(edges: dict[str, int]) -> dict[str, Any]:
    budget: dict[str, Any] = {"max_transitions": 2000, "max_actions": 2000, "max_fan_out": 64}
    if edges:
        budget["edges"] = edges
    return budget


def _notes(out: Lowering, d: Definition, name: str, start: str) -> None:
    out.at(("metadata",), (d.index, "id"))
    out.at(("spec", "triggers"), (d.index,))
    if name != d.id:
        out.note(("metadata", "name"), f"id {d.id!r} -> {name} (a DNS label)")
    out.note(
        ("spec", "triggers"),
        f"a signed POST /webhooks/{name} (the Webhook below, checked by the gateway) "
        f"arrives as a CloudEvent {start} whose data is the payload: the run's "
        "inputs; a delivery of another event has another type and starts nothing",
    )
    out.note(
        ("spec", "context"),
        "the hub's bookkeeping, kept in the run: attempts, status and evidence per stage, and "
        "the signal key a stage waits for",
    )
    out.note(
        ("spec", "budget"),
        "every attempt, refusal and wait is a transition here; kxm's maxTransitions budgets "
        "(definition, stage, edge) are the edge budgets its declared transitions count "
        "against: spent, the run fails (budget_exceeded)",
    )


def _hook(src: Document, d: Definition, lowered: Lowered) -> Document | None:
    """The gateway's Webhook for one definition, with the notes on how it maps."""
    hook = Lowering(src, DIALECT)
    hook.at((), (d.index,))
    webhook = _webhook(d, hook)
    if webhook is None:
        return None
    hook.note(
        ("spec", "scheme"),
        "jira and github sign the body (HMAC-SHA256); a generic sender's KXM contract "
        "binds a timestamp and a delivery id, as the Standard Webhooks scheme does",
    )
    hook.note(
        ("spec", "signals"),
        f"POST /webhooks/{dns_label(d.id)}/runs/<run>/signals/<key>: a stage waiting under "
        "its own id takes the signal; any other key can be sent to the run as a "
        "kxm.signal event naming it (data.signal)",
    )
    return hook.finish(webhook, lowered)
