"""What every part of deciding shares, seen in the records: a run under a spawn allowance
that fails reports what it spent, whatever failed it."""

from __future__ import annotations

from interlock.core import events as ev
from interlock.core.vocabulary import ErrorClass, RunStatus
from support.core import TWO_STEP_CHILD, Run, compile_one

CHILD = TWO_STEP_CHILD.replace("{BUDGET}", "budget: {max_actions: 1}")


def test_a_child_run_failed_by_its_own_budget_reports_the_spawns_it_spent() -> None:
    child = Run(compile_one(CHILD), "r-child")
    child.start(spawn=ev.SpawnBudget(depth=1, allowance=5))
    child.answer({})
    end = child.log[-1]
    assert isinstance(end, ev.RunFailed)
    assert end.data.error.error_class == ErrorClass.BUDGET_EXCEEDED
    assert end.data.error.message == "more than budget.max_actions (1) actions"
    # One action asked for: that is what the parent charges back, not the 5 handed down.
    assert end.data.spawns == 1
    assert child.state.status == RunStatus.FAILED


PARENT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: parent}
spec:
  initial_state: delegate
  states:
    delegate:
      actions: [{workflow: child}, {capability: wrap}]
      on:
        - {event: task.completed, goto: done}
        - {event: work.abandoned, goto: done}
    done: {type: terminal}
"""


def test_a_child_workflow_action_cancelled_names_the_workflow() -> None:
    # The shell cancels the child run (not an agent's task) for such a cancellation.
    parent = Run(compile_one(PARENT), "r-parent")
    parent.start()
    child_action = parent.pending_id()
    records = parent.send("work.abandoned", {})
    assert [r.data for r in records if isinstance(r, ev.ActionCancelled)] == [
        ev.ActionCancelledData(
            action_id=child_action,
            state="delegate",
            reason="left state 'delegate' on work.abandoned",
            workflow="child",
        )
    ]


WAITS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: waits}
spec:
  initial_state: review
  states:
    review:
      actions: [{capability: review}]
      on: [{event: task.completed, goto: approval}]
    approval:
      type: human_in_the_loop
      on: [{event: approval.granted, guard: result.score > 5, goto: done}]
    done:
      type: terminal
      outputs: {score: "{{ result.score }}"}
"""


def test_outside_an_answer_result_is_the_runs_last_action_result() -> None:
    run = Run(compile_one(WAITS))
    run.start()
    run.answer({"score": 9})
    records = run.send("approval.granted", {})
    fired = [r for r in records if isinstance(r, ev.TransitionFired)]
    assert [(f.data.from_state, f.data.to_state) for f in fired] == [("approval", "done")]
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"score": 9}


def test_without_an_event_expressions_see_event_empty_and_data_null() -> None:
    text = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: no-event}
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: work
          input: {has_id: '{{ "id" in event }}', size: '{{ size(event) }}', data: '{{ data }}'}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    run = Run(compile_one(text))
    records = run.start()
    requested = records[-1]
    assert isinstance(requested, ev.ActionRequested)
    assert requested.data.input == {"has_id": False, "size": 0, "data": None}
