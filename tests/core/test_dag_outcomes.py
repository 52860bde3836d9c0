"""A DAG's skips and failures as the log records them: a skip names the edge it missed
(and a skip makes the steps waiting on it skip in the same decision, whatever their order),
and a step that fails for good under ``completion: all`` cancels the steps in flight and
fails the state with the step named and the agent's class and code kept."""

from __future__ import annotations

from interlock.core import events as ev
from support.core import Run, compile_one

FLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: ship}
spec:
  initial_state: build
  states:
    build:
      dag:
        steps:
          notify:
            depends_on: [{step: mend, on: [completed, failed]}]
            action: {capability: notify}
          mend:
            depends_on: [{step: test, on: [failed, skipped]}]
            action: {capability: mend}
          test: {action: {capability: test}}
          lint: {action: {capability: lint}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
BROKE = {"error": {"class": "agent_error", "message": "broke", "code": "tool_error"}}


def started() -> tuple[Run, dict[str | None, str]]:
    run = Run(compile_one(FLOW))
    run.start()
    requested = [r.data for r in run.log if isinstance(r, ev.ActionRequested)]
    return run, {r.step: r.action_id for r in requested}


def test_a_skip_names_the_edge_and_skips_what_waits_on_it_at_once() -> None:
    run, ids = started()
    assert sorted(s for s in ids if s) == ["lint", "test"]
    records = run.answer({}, action_id=ids["test"])
    assert [r.data for r in records if isinstance(r, ev.StepSkipped)] == [
        ev.StepSkippedData(
            state="build",
            step="mend",
            reason="test ended completed; mend runs on failed or skipped",
        ),
        ev.StepSkippedData(
            state="build",
            step="notify",
            reason="mend ended skipped; notify runs on completed or failed",
        ),
    ]
    assert run.state.pending.keys() == {ids["lint"]}


def test_a_failed_step_cancels_the_others_and_fails_the_run_naming_it() -> None:
    run, ids = started()
    records = run.answer(BROKE, type="task.failed", action_id=ids["lint"])
    [cancelled] = [r.data for r in records if isinstance(r, ev.ActionCancelled)]
    assert (cancelled.action_id, cancelled.reason) == (
        ids["test"],
        "step 'lint' of dag 'build' failed",
    )
    assert run.state.status == "failed"
    assert run.state.error == ev.ErrorInfo(
        error_class="agent_error",
        message="step 'lint' of dag 'build' failed: broke",
        code="tool_error",
    )
