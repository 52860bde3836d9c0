"""kxm definitions load as written: the webhook definitions (a JSON array) and Runtime
workflows (kxm.workflow.v1), each with the hub's and the Runtime's rules."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from interlock.core.source import load_documents
from interlock.dialects import prepare
from support.dialects import FIXTURES, converted_matches, errors_of, run_cli

WEBHOOKS = FIXTURES / "kxm-workflows.json"
RUNTIME = FIXTURES / "kxm-bug-fix.yaml"


@pytest.mark.parametrize("path", [WEBHOOKS, RUNTIME], ids=lambda p: p.name)
def test_each_example_validates_and_converts(path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(["validate", str(path)], capsys)
    assert code == 0, err
    converted_matches(path, capsys)


def test_the_seeds_example_validates_with_one_warning_for_its_degraded_minimum(
    capsys,  # type: ignore[no-untyped-def]
) -> None:
    """kxm's reference says its example "validates with one warning, for the degraded
    minimum of 1": here too, at the minimum, saying it is checked and not applied."""
    code, _, err = run_cli(["validate", str(WEBHOOKS)], capsys)
    assert code == 0, err
    assert err.strip().splitlines() == [
        f"{WEBHOOKS}:29:46: warning: kxm.degraded-minimum: stage 'plan': the degraded minimum "
        "of 1 for 'peer reviews' is checked, not applied: the stage needs minProducers (2) "
        "distinct producers"
    ]


def test_a_github_definitions_webhook_takes_only_its_event_from_the_unsigned_header() -> None:
    """GitHub names the event in X-GitHub-Event, which no signature covers: the Webhook
    lists the one event the definition takes, and compiles."""
    from interlock.core.compiler import compile_sources

    definitions = json.loads(WEBHOOKS.read_text())
    definitions[0] = {**definitions[0], "source": "github", "event": "pull_request"}
    text = json.dumps(definitions)
    prepared = prepare([("gh.json", text)])
    webhook = prepared.documents[1].data
    assert webhook["spec"]["type"] == {
        "header": "X-GitHub-Event",
        "prefix": "kxm.jira-development.",
        "values": ["pull_request"],
    }
    compiled = compile_sources([("hook.yaml", yaml.safe_dump(webhook))])
    assert compiled.diagnostics == []
    assert len(compiled.webhooks) == 1


def test_the_webhook_definition_lowers_to_stages_with_their_rules() -> None:
    prepared = prepare([(str(WEBHOOKS), WEBHOOKS.read_text())])
    wf = prepared.documents[0].data
    assert wf["metadata"]["name"] == "jira-development"
    assert wf["spec"]["triggers"] == [
        {
            "event": "kxm.jira-development.jira_issue_updated",
            "filter": {"issue.fields.status.name": "In Progress"},
        }
    ]
    webhook = prepared.documents[1].data
    assert webhook["kind"] == "Webhook"
    assert webhook["spec"]["type"] == {"field": "webhookEvent", "prefix": "kxm.jira-development."}
    assert webhook["spec"]["signals"] == {
        "prefix": "kxm.jira-development.signal.",
        "secret": {"env": "WORKFLOW_SIGNAL_SECRET"},
    }
    states = wf["spec"]["states"]
    assert set(states) == {
        "plan", "plan-wait", "plan-peers", "implement", "implement-wait",
        "implement-escalated", "ci", "ci-wait", "completed", "failed",
    }  # fmt: skip
    peers = states["plan-peers"]["parallel"]
    assert [a["capability"] for a in peers["actions"]] == [
        "kxm.reviewer-claude",
        "kxm.reviewer-grok",
    ]
    assert states["plan-peers"]["parallel"]["completion"] == {"at_least": 2}
    assert states["plan-peers"]["catch"] == [
        {
            "errors": ["*"],
            "codes": ["quorum_not_met"],
            "goto": "plan",
            "set": {
                "refused": "{{ \"stage plan: too few peer replies for 'peer reviews' "
                '(minProducers 2): " + result.error.message }}'
            },
        }
    ]
    assert states["plan"]["actions"][0]["timeout"] == "86400000ms"
    caps = prepared.agents[0].data["spec"]["capabilities"]
    assert [c["name"] for c in caps] == [
        "kxm.coordinator",
        "kxm.reviewer-claude",
        "kxm.reviewer-grok",
    ]


def definitions() -> list[dict[str, Any]]:
    return json.loads(WEBHOOKS.read_text())


def broken(change: Any) -> list[str]:
    data = definitions()
    change(data[0])
    return errors_of("w.json", json.dumps(data, indent=2))


def _set(path: list[Any], value: Any) -> Any:
    def change(d: dict[str, Any]) -> None:
        target = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


WEBHOOK_RULES = [
    ("forward target", _set(["stages", 0, "on", "passed"], "ci"), "kxm.forward-target"),
    ("unknown stage", _set(["stages", 0, "on", "passed"], "deploy"), "kxm.unknown-stage"),
    ("back-edge without budget", lambda d: d.pop("maxTransitions"), "kxm.back-edge-budget"),
    ("both secrets", _set(["secret"], "x" * 20), "kxm.secret"),
    ("short secret", lambda d: (d.pop("secretEnv"), d.update(secret="short")), "kxm.invalid-value"),
    ("policy key", _set(["stages", 0, "requiredEvidence"], ["approved plan"]), "kxm.policy-key"),
    (
        "target eligible",
        _set(
            ["stages", 0, "evidencePolicies", "peer reviews", "eligibleAgents"],
            ["coordinator", "reviewer-grok"],
        ),
        "kxm.invalid-value",
    ),
    (
        "minProducers",
        _set(["stages", 0, "evidencePolicies", "peer reviews", "minProducers"], 3),
        "kxm.invalid-value",
    ),
    (
        "degradation",
        _set(["stages", 0, "evidencePolicies", "peer reviews", "degradation"], {"minProducers": 2}),
        "kxm.invalid-value",
    ),
    (
        "unknown policy field",
        _set(["stages", 0, "evidencePolicies", "peer reviews", "quorum"], 2),
        "kxm.unknown-key",
    ),
    (
        "accepted statuses",
        _set(["stages", 0, "evidencePolicies", "peer reviews", "acceptedStatuses"], ["read"]),
        "kxm.invalid-value",
    ),
    (
        "duplicate evidence",
        _set(["stages", 1, "requiredEvidence"], ["diff", " DIFF "]),
        "kxm.duplicate-evidence",
    ),
    ("maxAttempts", _set(["stages", 1, "maxAttempts"], 21), "kxm.invalid-value"),
    ("ttl", _set(["ttlMs"], 10), "kxm.invalid-value"),
    ("area", _set(["stages", 1, "area"], "ops"), "kxm.invalid-value"),
    ("requirePlanHash", _set(["requirePlanHash"], ["deploy"]), "kxm.unknown-stage"),
    ("planHash key", _set(["planHash", "evidenceKey"], "diff"), "kxm.unknown-evidence"),
    ("no instructions", lambda d: d["stages"][1].pop("instructions"), "kxm.missing-field"),
]


@pytest.mark.parametrize(
    ("what", "change", "rule"), WEBHOOK_RULES, ids=[r[0] for r in WEBHOOK_RULES]
)
def test_each_hub_rule_refuses_a_definition_that_breaks_it(
    what: str, change: Any, rule: str
) -> None:
    errors = broken(change)
    assert errors, what
    assert any(f": {rule}: " in e for e in errors), errors
    assert all(e.startswith("w.json:") and int(e.split(":")[1]) > 1 for e in errors), errors


def test_duplicate_ids_and_unknown_fields() -> None:
    data = definitions()
    data[0]["somethingNew"] = 1  # unknown fields are ignored
    data.append(copy.deepcopy(data[0]))
    errors = errors_of("w.json", json.dumps(data, indent=2))
    assert len(errors) == 1
    assert ": kxm.duplicate-id: " in errors[0]


def runtime() -> dict[str, Any]:
    documents, _ = load_documents(RUNTIME.read_text(), "bug-fix.yaml")  # `on` stays "on"
    return copy.deepcopy(documents[0].data)


RUNTIME_RULES = [
    (
        "gate outcome impossible",
        ["steps", 2, "on"],
        {"passed": "review", "failed": "implement"},
        "kxm.gate-outcome-impossible",
    ),
    (
        "gate outcome renamed",
        ["steps", 2, "on"],
        {
            "passed": "review",
            "implementation_failure": {"target": "implement", "maxTransitions": 1},
        },
        "kxm.gate-outcome-renamed",
    ),
    (
        "back-edge needs its budget",
        ["steps", 2, "on", "implementation-failure"],
        "implement",
        "kxm.back-edge-budget",
    ),
    ("terminal needs a status", ["steps", 4, "on", "approved"], "$terminal", "kxm.terminal-status"),
    ("unknown step", ["steps", 1, "on", "done"], "deploy", "kxm.unknown-step"),
    ("unknown kind", ["steps", 1, "kind"], "script", "kxm.invalid-value"),
    ("reserved kind", ["steps", 1, "kind"], "workflow", "kxm.reserved"),
    ("bad join", ["steps", 3, "join"], "majority", "kxm.invalid-value"),
    ("schema", ["schema"], "kxm.workflow.v2", "kxm.invalid-value"),
]


@pytest.mark.parametrize(
    ("what", "path", "value", "rule"), RUNTIME_RULES, ids=[r[0] for r in RUNTIME_RULES]
)
def test_each_runtime_rule_refuses_a_file_that_breaks_it(
    what: str, path: list[Any], value: Any, rule: str
) -> None:
    data = runtime()
    _set(path, value)(data)
    errors = errors_of("bug-fix.yaml", yaml.safe_dump(data, sort_keys=False), "kxm")
    assert any(f": {rule}: " in e for e in errors), errors


def test_on_is_required_on_every_step() -> None:
    data = runtime()
    del data["steps"][4]["on"]
    errors = errors_of("bug-fix.yaml", yaml.safe_dump(data, sort_keys=False))
    assert any("kxm.missing-field: on is required on every step" in e for e in errors), errors


def test_limits_become_the_deadline_and_a_cost_budget() -> None:
    prepared = prepare([("bug-fix.yaml", RUNTIME.read_text())])
    spec = prepared.documents[0].data["spec"]
    assert spec["deadline"] == {"after": "3600000ms"}
    assert spec["budget"]["max_cost"] == 5  # limits.maxModelCost: the native cost budget
    assert "cost" not in spec["context"]
    implement = spec["states"]["implement"]
    assert implement["on"][0] == {
        "event": "task.failed",
        "guard": 'result.error.code == "max_cost"',
        "goto": "over_budget",
        "set": {"reason": "maxModelCost 5 exceeded at implement"},
    }
    # Two distinct critics: a native quorum of distinct producers.
    assert spec["states"]["review"]["parallel"]["completion"] == {"at_least": 2}


def test_each_evidence_policy_is_a_quorum_of_its_own_in_turn() -> None:
    data = definitions()
    plan = data[0]["stages"][0]
    plan["requiredEvidence"].append("security review")
    plan["evidencePolicies"]["security review"] = {
        "kind": "peer-reply",
        "minProducers": 1,
        "eligibleAgents": ["security-bot"],
    }
    prepared = prepare([("w.json", json.dumps(data))])
    assert not prepared.diagnostics
    states = prepared.documents[0].data["spec"]["states"]
    first, second = states["plan-peers"], states["plan-peers-2"]
    assert first["parallel"]["completion"] == {"at_least": 2}
    assert [t["goto"] for t in first["on"]] == ["plan-peers-2"]
    assert second["parallel"]["completion"] == {"at_least": 1}
    assert [a["capability"] for a in second["parallel"]["actions"]] == ["kxm.security-bot"]
    assert second["on"][0]["goto"] == "implement"
    assert second["catch"][0]["goto"] == "plan"


@pytest.mark.parametrize(
    ("agents", "completion"),
    [
        (["critic-a", "critic-b", "critic-c"], {"at_least": 2}),
        (["critic-a", "critic-a"], "all_settled"),
    ],
)
def test_a_quorum_join_counts_producers_only_when_the_agents_differ(
    agents: list[str], completion: Any
) -> None:
    data = runtime()
    review = data["steps"][3]
    review["agents"] = agents
    prepared = prepare([("bug-fix.yaml", yaml.safe_dump(data, sort_keys=False))])
    state = prepared.documents[0].data["spec"]["states"]["review"]
    assert state["parallel"]["completion"] == completion
    passed = next(t for t in state["on"] if t["event"] == "task.completed")
    counted = "size() >= 2" in passed.get("guard", "")
    assert counted == (completion == "all_settled")


def test_required_evidence_is_the_stage_gate() -> None:
    prepared = prepare([(str(WEBHOOKS), WEBHOOKS.read_text())])
    states = prepared.documents[0].data["spec"]["states"]
    answered = '("evidence" in result ? result.evidence : {})'
    when = '!("wait" in result) && "status" in result && result.status == "passed"'
    # "peer reviews" is for the peers alone: the gate requires the rest.
    assert states["plan"]["gate"] == {
        "requires": {"approved plan": True},
        "evidence": ['context["evidence:plan"]', answered],
        "when": when,
    }
    # requirePlanHash: the captured plan is one more predicate, from the run, not the answer.
    assert states["implement"]["gate"] == {
        "requires": {"diff": True, "$planHash": True},
        "evidence": ['context["evidence:implement"]', answered, '{"$planHash": context.plan}'],
        "when": when,
    }
    # No refusal edge is left for evidence: the gate refuses. The one refusal edge is a
    # reply without a status, which no gate can read.
    refusals = [t for t in states["implement"]["on"] if "refused" in t.get("set", {})]
    assert [t["guard"] for t in refusals] == ['!("wait" in result) && !("status" in result)']


def test_a_key_as_written_is_proven_by_its_normalized_spelling() -> None:
    data = definitions()
    data[0]["stages"][1]["requiredEvidence"] = ["The  Diff"]
    prepared = prepare([("w.json", json.dumps(data))])
    gate = prepared.documents[0].data["spec"]["states"]["implement"]["gate"]
    assert gate["requires"] == {"The  Diff": True, "$planHash": True}
    assert gate["evidence"][1:3] == [
        '"the diff" in context["evidence:implement"] ? '
        '{"The  Diff": context["evidence:implement"]["the diff"]} : {}',
        '"the diff" in ("evidence" in result ? result.evidence : {}) ? '
        '{"The  Diff": ("evidence" in result ? result.evidence : {})["the diff"]} : {}',
    ]


def test_a_stage_without_required_evidence_has_no_gate() -> None:
    data = definitions()
    data[0]["stages"][2]["requiredEvidence"] = []
    prepared = prepare([("w.json", json.dumps(data))])
    assert "gate" not in prepared.documents[0].data["spec"]["states"]["ci"]


def test_transition_budgets_are_edge_budgets_of_the_declared_transitions() -> None:
    prepared = prepare([(str(WEBHOOKS), WEBHOOKS.read_text())])
    spec = prepared.documents[0].data["spec"]
    assert spec["budget"]["edges"] == {
        "replies-without-status": 1000,
        "run": 6,
        "stage:ci": 2,
        "edge:ci:failed": 2,
    }
    assert not any(k.startswith(("transitions", "edge:")) for k in spec["context"])
    back = [
        t
        for state in ("ci", "ci-wait")
        for t in spec["states"][state]["on"]
        if t["goto"] == "implement"
    ]
    assert len(back) == 3  # the checkpoint, and the signal both ways
    assert all(t["budget"] == ["run", "stage:ci", "edge:ci:failed"] for t in back)
    # A forward declared edge counts against the run's budget alone.
    forward = [t for t in spec["states"]["plan-peers"]["on"] if t["goto"] == "implement"]
    assert [t["budget"] for t in forward] == [["run"]]


def test_runtime_back_edges_count_against_their_own_and_the_run_budget() -> None:
    prepared = prepare([("bug-fix.yaml", RUNTIME.read_text())])
    spec = prepared.documents[0].data["spec"]
    assert spec["budget"]["edges"] == {
        "edge:verify:implementation-failure": 2,
        "run": 4,
        "edge:review:failed": 1,
    }
    back = [t for t in spec["states"]["verify"]["on"] if t["goto"] == "implement"]
    assert [t["budget"] for t in back] == [["edge:verify:implementation-failure", "run"]]
    assert "transitions" not in spec["context"]


def test_a_passing_signal_on_a_stage_with_peer_policies_goes_to_the_peers() -> None:
    prepared = prepare([(str(WEBHOOKS), WEBHOOKS.read_text())])
    wait = prepared.documents[0].data["spec"]["states"]["plan-wait"]
    passing = [t for t in wait["on"] if t["goto"] not in ("plan", "plan-wait", "failed")]
    assert {t["goto"] for t in passing} == {"plan-peers"}
    assert all("peer reviews" not in t["guard"] for t in passing)


def _two_stages() -> list[dict[str, Any]]:
    """A reproduction confirmed by its stage (the oracle), then a fix that waits for CI."""
    return [
        {
            "id": "bug", "project": "p", "target": "coordinator", "secretEnv": "S",
            "promptTemplate": "Fix {{issue.key}}",
            "reproOracle": {"stageId": "reproduce", "evidenceKey": "repro"},
            "stages": [
                {"id": "reproduce", "instructions": "Reproduce.", "requiredEvidence": ["repro"]},
                {"id": "fix", "instructions": "Fix, then wait for CI.",
                 "requiredEvidence": ["diff", "ci"]},
            ],
        }
    ]  # fmt: skip


class _Driven:
    """One run of a lowered definition, decided by the pure core (no NATS)."""

    def __init__(self, data: list[dict[str, Any]]) -> None:
        from interlock.core.compiler import compile_sources
        from interlock.core.engine import start
        from interlock.core.state import fold

        prepared = prepare([("bug.json", json.dumps(data))])
        compiled = compile_sources(prepared.sources, documents=prepared.documents)
        assert compiled.ok, compiled.diagnostics
        self.definition = compiled.workflows[0]
        self.log = start(self.definition, run_id="r-1", inputs={}, now="2026-01-01T00:00:00Z")
        self.state = fold(self.log)
        self.n = 0

    def deliver(self, kind: str, data: Any, **extensions: str) -> list[Any]:
        from interlock.core.engine import Incoming, decide
        from interlock.core.state import fold

        self.n += 1
        if not extensions:
            extensions = {"actionid": next(iter(self.state.pending))}
        incoming = Incoming(type=kind, source="test", id=f"e-{self.n}", data=data,
                            extensions=extensions)  # fmt: skip
        out = decide(self.definition, self.state, incoming, f"2026-01-01T00:00:{self.n:02d}Z")
        self.log += out
        self.state = fold(out, self.state)
        return out


def _checked(records: list[Any]) -> list[tuple[str, bool, list[str]]]:
    from interlock.core import events as ev

    return [
        (r.data.state, r.data.proven, r.data.missing)
        for r in records
        if isinstance(r, ev.GateChecked)
    ]


def test_a_weakened_reproduction_is_refused_by_the_gate_at_no_cost_of_an_attempt() -> None:
    run = _Driven(_two_stages())
    run.deliver("task.completed", {"status": "passed", "evidence": {"repro": "crash on 0"}})
    assert run.state.state == "fix"
    assert run.state.context["repro"] == "crash on 0"
    weaker = {"status": "passed", "evidence": {"diff": "+x", "ci": "ok", "repro": "no crash"}}
    out = run.deliver("task.completed", weaker)
    assert _checked(out) == [("fix", False, ["$reproOracle"])]
    assert run.state.state == "fix"  # asked again, same attempt, no transition
    (pending,) = run.state.pending.values()
    assert pending.attempt == 1
    kept = {"status": "passed", "evidence": {"diff": "+x", "ci": "ok", "repro": "crash on 0"}}
    out = run.deliver("task.completed", kept)
    assert _checked(out) == [("fix", True, [])]
    assert run.state.status == "completed"


def test_a_signal_releasing_a_wait_is_checked_by_the_wait_states_gate() -> None:
    run = _Driven(_two_stages())
    run.deliver("task.completed", {"status": "passed", "evidence": {"repro": "crash on 0"}})
    run.deliver("task.completed", {"wait": "ci", "evidence": {"diff": "+x"}})
    assert run.state.state == "fix-wait"
    # Passed, but without "ci": not taken, and the log says what it missed.
    out = run.deliver("kxm.bug.signal.fix", {"status": "passed", "evidence": {}}, runid="r-1")
    assert _checked(out) == [("fix-wait", False, ["ci"])]
    assert run.state.state == "fix-wait"
    # A weakened reproduction in a signal is refused the same way.
    weaker = {"status": "passed", "evidence": {"ci": "green", "repro": "no crash"}}
    out = run.deliver("kxm.signal", {"signal": "ci", **weaker}, runid="r-1")
    assert _checked(out) == [("fix-wait", False, ["$reproOracle"])]
    # A failed signal is not gated: it takes an attempt as before.
    out = run.deliver("kxm.signal", {"signal": "ci", "status": "failed"}, runid="r-1")
    assert _checked(out) == []
    assert run.state.state == "fix"
    run.deliver("task.completed", {"wait": "ci", "evidence": {"diff": "+y"}})
    out = run.deliver("kxm.bug.signal.fix", {"status": "passed", "evidence": {"ci": "green"}},
                      runid="r-1")  # fmt: skip
    assert _checked(out) == [("fix-wait", True, [])]
    assert run.state.status == "completed"
    assert run.state.outputs is not None
    assert run.state.outputs["evidence"]["fix"] == {"ci": "green"}


def test_without_ttl_ms_a_request_lives_as_long_as_the_hubs_default() -> None:
    def action_of(items: list[dict[str, Any]]) -> dict[str, Any]:
        prepared = prepare([("w.json", json.dumps(items))])
        assert prepared.ok, prepared.diagnostics
        return prepared.documents[0].data["spec"]["states"]["plan"]["actions"][0]

    items = definitions()
    written = action_of(items)
    assert written["timeout"] == "86400000ms"  # the example's own ttlMs
    assert written["input"]["delivery"] == "followUp"
    items[0]["ttlMs"] = 60_000
    items[0]["delivery"] = "steer"
    steered = action_of(items)
    assert (steered["timeout"], steered["input"]["delivery"]) == ("60000ms", "steer")
    del items[0]["ttlMs"], items[0]["delivery"]
    defaulted = action_of(items)
    # KXM_MESSAGE_TTL_MS's default (24 h), and followUp, the default delivery.
    assert (defaulted["timeout"], defaulted["input"]["delivery"]) == ("86400000ms", "followUp")
