"""DAG states: each step starts as soon as the steps it depends on have ended as their
edges ask, several at once, with no barrier; a branch not taken is skipped; every step's
life is in the log and folds back to the same state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import CapabilityDef, RetryPolicy, link
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import ErrorClass, RunStatus
from support.core import Run, compile_one, types

RELEASE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: release}
spec:
  initial_state: ship
  states:
    ship:
      dag:
        parallelism: 4
        steps:
          build:
            action: {capability: ci.build}
          lint:
            action: {capability: ci.lint}
          test:
            depends_on: [build]
            action:
              capability: ci.test
              input: {wheel: "{{ steps.build.output.wheel }}"}
          deploy:
            depends_on: [{step: test, on: completed}, lint]
            action: {capability: release.deploy}
          rollback:
            depends_on: [{step: test, on: failed}]
            action: {capability: release.rollback}
      on:
        - event: task.completed
          goto: done
      catch:
        - errors: ["*"]
          goto: broken
    done:
      type: terminal
      outputs:
        deploy: $.states.ship.output.deploy.status
        rollback: $.states.ship.output.rollback.status
    broken: {type: terminal}
"""


def test_a_dag_needs_the_capabilities_of_all_its_steps() -> None:
    """The orchestrator makes a consumer for each capability a workflow needs: every
    step's, the ones only a failure reaches included."""
    assert compile_one(RELEASE).capabilities() == {
        "ci.build", "ci.lint", "ci.test", "release.deploy", "release.rollback",
    }  # fmt: skip


def test_link_fills_each_dag_step_from_its_agentdef() -> None:
    """A step's action takes its AgentDef's timeout and retries like any other action; the
    steps, their order and their dependencies stay as written."""
    written = compile_one(RELEASE)
    linked = link(written, {"ci.test": CapabilityDef("ci.test", timeout_s=13, max_retries=1)})
    dag, before = linked.states["ship"].dag, written.states["ship"].dag
    assert dag is not None
    assert before is not None
    test = next(s for s in before.steps if s.name == "test")
    assert (test.action.timeout_s, test.action.retry) == (None, None)
    action = replace(test.action, timeout_s=13, retry=RetryPolicy(max_attempts=2))
    filled = replace(test, action=action)
    assert dag == replace(
        before, steps=tuple(filled if s.name == "test" else s for s in before.steps)
    )


def _pending(run: Run) -> dict[str, str]:
    """Step name -> action id of every step in flight."""
    return {p.step or "": a for a, p in run.state.pending.items()}


def test_steps_start_as_soon_as_their_dependencies_allow_without_barriers() -> None:
    run = Run(compile_one(RELEASE))
    run.start()
    # build and lint have no dependencies: both are asked for at once.
    assert sorted(_pending(run)) == ["build", "lint"]
    run.answer({"wheel": "w.whl"}, action_id=_pending(run)["build"])
    # test needs only build: it starts while lint is still running.
    assert sorted(_pending(run)) == ["lint", "test"]
    test_request = run.log[-1]
    assert isinstance(test_request, ev.ActionRequested)
    assert test_request.data.step == "test"
    assert test_request.data.input == {"wheel": "w.whl"}
    run.answer({}, action_id=_pending(run)["test"])
    # rollback waits for a failure of test that did not come: skipped at once; deploy
    # still waits for lint.
    assert run.state.dag is not None
    assert run.state.dag.status["rollback"] == "skipped"
    assert sorted(_pending(run)) == ["lint"]
    run.answer({}, action_id=_pending(run)["lint"])
    run.answer({}, action_id=_pending(run)["deploy"])
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"deploy": "completed", "rollback": "skipped"}
    kinds = types(run.log)
    assert kinds.count("dag.started") == 1
    assert kinds.count("step.skipped") == 1
    assert kinds.count("dag.completed") == 1
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_a_failure_some_step_depends_on_is_a_branch_not_a_failure() -> None:
    run = Run(compile_one(RELEASE))
    run.start()
    run.answer({"wheel": "w"}, action_id=_pending(run)["build"])
    run.answer(
        {"error": {"class": "agent_error", "message": "3 tests failed"}},
        type="task.failed",
        action_id=_pending(run)["test"],
    )
    assert run.state.dag is not None
    assert run.state.dag.status["test"] == "failed"
    assert run.state.dag.status["deploy"] == "skipped"
    # deploy is skipped as soon as test failed, even though lint has not ended.
    assert sorted(_pending(run)) == ["lint", "rollback"]
    run.answer({}, action_id=_pending(run)["rollback"])
    run.answer({}, action_id=_pending(run)["lint"])
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"deploy": "skipped", "rollback": "completed"}


def test_an_unhandled_failure_fails_the_state_and_cancels_the_rest() -> None:
    run = Run(compile_one(RELEASE))
    run.start()
    run.answer(
        {"error": {"class": "agent_error", "message": "no compiler"}},
        type="task.failed",
        action_id=_pending(run)["build"],
    )
    assert run.state.state == "broken"
    cancelled = [r for r in run.log if isinstance(r, ev.ActionCancelled)]
    assert [c.data.action_id for c in cancelled] == [
        r.data.action_id
        for r in run.log
        if isinstance(r, ev.ActionRequested) and r.data.step == "lint"
    ]


def test_all_settled_runs_every_step_that_can_run_whatever_the_outcomes() -> None:
    text = RELEASE.replace("parallelism: 4", "parallelism: 4\n        completion: all_settled")
    run = Run(compile_one(text))
    run.start()
    [started] = [r for r in run.log if isinstance(r, ev.DagStarted)]
    assert started.data == ev.DagStartedData(
        state="ship",
        steps=["build", "lint", "test", "deploy", "rollback"],
        parallelism=4,
        completion="all_settled",
    )
    assert b'"completion":"all_settled"' in ev.encode(started)
    run.answer(
        {"error": {"class": "agent_error", "message": "no compiler"}},
        type="task.failed",
        action_id=_pending(run)["build"],
    )
    # test needs build completed: skipped; so deploy and rollback are skipped too.
    run.answer({}, action_id=_pending(run)["lint"])
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"deploy": "skipped", "rollback": "skipped"}
    result = run.state.states["ship"]["output"]
    assert result["build"]["status"] == "failed"
    assert result["build"]["error"]["message"] == "no compiler"


def test_parallelism_bounds_the_steps_in_flight() -> None:
    text = RELEASE.replace("parallelism: 4", "parallelism: 1")
    run = Run(compile_one(text))
    run.start()
    assert sorted(_pending(run)) == ["build"]
    run.answer({"wheel": "w"})
    assert sorted(_pending(run)) == ["lint"]


def test_a_step_retries_and_keeps_its_name_across_attempts() -> None:
    text = RELEASE.replace(
        "action: {capability: ci.lint}",
        "action: {capability: ci.lint, retry: {max_attempts: 2, backoff: {initial: 1s}}}",
    )
    run = Run(compile_one(text))
    run.start()
    lint = _pending(run)["lint"]
    run.answer(
        {"error": {"class": "timeout", "message": "slow"}}, type="task.failed", action_id=lint
    )
    assert run.state.dag is not None
    assert run.state.dag.status["lint"] == "running"
    run.fire("retry")
    again = run.log[-1]
    assert isinstance(again, ev.ActionRequested)
    assert (again.data.step, again.data.attempt, again.data.action_id) == ("lint", 2, lint)


@pytest.mark.parametrize(
    ("steps", "rule"),
    [
        ("a: {depends_on: [a], action: {capability: x}}", "dag-self-dependency"),
        ("a: {depends_on: [nope], action: {capability: x}}", "dag-unknown-step"),
        (
            "a: {depends_on: [b], action: {capability: x}}\n"
            "          b: {depends_on: [a], action: {capability: x}}",
            "dag-cycle",
        ),
    ],
)
def test_a_broken_graph_is_refused_with_its_rule_and_position(steps: str, rule: str) -> None:
    text = f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: broken}}
spec:
  initial_state: s
  states:
    s:
      dag:
        steps:
          {steps}
      on: [{{event: task.completed, goto: end}}]
    end: {{type: terminal}}
"""
    diags = compile_sources([("broken.yaml", text)]).diagnostics
    assert [d.rule for d in diags] == [rule]
    assert diags[0].path == "broken.yaml"
    assert diags[0].line == 10


def test_a_dag_is_a_kind_of_state_of_its_own() -> None:
    text = RELEASE.replace("      dag:\n", "      actions: [{capability: x}]\n      dag:\n")
    diags = compile_sources([("two.yaml", text)]).diagnostics
    assert "state-kind" in [d.rule for d in diags]


def test_the_budget_on_actions_applies_to_dag_steps() -> None:
    text = RELEASE.replace(
        "  initial_state: ship", "  initial_state: ship\n  budget: {max_actions: 2}"
    )
    run = Run(compile_one(text))
    run.start()
    run.answer({"wheel": "w"}, action_id=_pending(run)["build"])
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    assert run.state.error.error_class == ErrorClass.BUDGET_EXCEEDED


GATED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: gated}
spec:
  evidence: {events: [release.evidence]}
  initial_state: ship
  states:
    ship:
      dag:
        steps:
          test: {action: {capability: ci.test}}
          publish:
            depends_on: [test]
            requires: {receipt: verified, approval: true}
            subject: release/publish
            action: {capability: release.publish}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def _evidence(run: Run, data: object, event_id: str) -> list[ev.AnyRecord]:
    return run.send("release.evidence", data, event_id=event_id)


def test_a_gated_step_is_held_until_the_evidence_proves_every_predicate() -> None:
    run = Run(compile_one(GATED))
    run.start()
    run.answer({}, action_id=_pending(run)["test"])
    held = run.log[-1]
    assert isinstance(held, ev.GateChecked)
    assert (held.data.step, held.data.proven) == ("publish", False)
    assert held.data.missing == ["receipt", "approval"]
    assert _pending(run) == {}
    # A wrong value and an empty one prove nothing (fail-closed).
    records = _evidence(run, {"release/publish": {"receipt": "forged", "approval": ""}}, "e1")
    assert types(records) == ["evidence.recorded"]
    assert _pending(run) == {}
    records = _evidence(run, {"release/publish": {"receipt": "verified", "approval": "o"}}, "e2")
    assert types(records) == ["evidence.recorded", "gate.checked", "action.requested"]
    assert sorted(_pending(run)) == ["publish"]
    run.answer({}, action_id=_pending(run)["publish"])
    assert run.state.status == RunStatus.COMPLETED
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_evidence_that_arrives_before_the_gate_is_checked_is_kept_and_counts() -> None:
    run = Run(compile_one(GATED))
    run.start()
    proof = {"release/publish": {"receipt": "verified", "approval": "owner"}}
    assert types(_evidence(run, proof, "early")) == ["evidence.recorded"]
    assert run.state.evidence == proof
    run.answer({}, action_id=_pending(run)["test"])
    checked = [r for r in run.log if isinstance(r, ev.GateChecked)]
    assert [(c.data.proven, c.data.missing) for c in checked] == [(True, [])]
    assert sorted(_pending(run)) == ["publish"]


def test_evidence_is_recorded_once_per_event() -> None:
    run = Run(compile_one(GATED))
    run.start()
    assert types(_evidence(run, {"x": {"a": "b"}}, "same")) == ["evidence.recorded"]
    assert _evidence(run, {"x": {"a": "c"}}, "same") == []
    assert run.state.evidence == {"x": {"a": "b"}}


def test_a_gate_nothing_could_open_is_refused() -> None:
    text = GATED.replace("  evidence: {events: [release.evidence]}\n", "")
    diags = compile_sources([("g.yaml", text)]).diagnostics
    assert [(d.rule, d.line) for d in diags] == [("gate-without-evidence", 13)]


def test_a_gated_step_without_dependencies_is_checked_when_the_dag_starts() -> None:
    text = GATED.replace("            depends_on: [test]\n", "")
    run = Run(compile_one(text))
    records = run.start()
    assert types(records) == [
        "run.started",
        "state.entered",
        "dag.started",
        "action.requested",
        "gate.checked",
    ]
    held = records[-1]
    assert isinstance(held, ev.GateChecked)
    assert held.data == ev.GateCheckedData(
        state="ship",
        step="publish",
        subject="release/publish",
        proven=False,
        missing=["receipt", "approval"],
    )
    assert sorted(_pending(run)) == ["test"]
    proof = {"release/publish": {"receipt": "verified", "approval": "owner"}}
    assert types(_evidence(run, proof, "e1")) == [
        "evidence.recorded",
        "gate.checked",
        "action.requested",
    ]
    assert sorted(_pending(run)) == ["publish", "test"]


def test_a_completed_step_names_who_answered_it() -> None:
    text = RELEASE.replace(
        'input: {wheel: "{{ steps.build.output.wheel }}"}',
        'input: {built_by: "{{ steps.build.source }}", '
        "lint_done: '{{ \"source\" in steps.lint }}'}",
    )
    run = Run(compile_one(text))
    run.start()
    run.answer({"wheel": "w.whl"}, action_id=_pending(run)["build"])
    test_request = run.log[-1]
    assert isinstance(test_request, ev.ActionRequested)
    # build answered (by the agent's source); lint has not: it has no source yet.
    assert test_request.data.input == {"built_by": "interlock://agent/test", "lint_done": False}
    assert run.state.dag is not None
    assert run.state.dag.view()["build"]["source"] == "interlock://agent/test"
    assert "source" not in run.state.dag.view()["lint"]
