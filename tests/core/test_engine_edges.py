"""Engine behaviour the golden scenarios do not reach: what a loop's ``until`` can read, how
an agent's failure is read when it is not the documented shape, and what a failing child
run reports to its parent."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.vocabulary import ErrorClass, RunStatus
from support.core import Run, compile_one, types

LOOP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: poll}
spec:
  initial_state: poll
  states:
    poll:
      loop:
        until: iteration >= 2 && data.ok == true && result.ok == true
        max_iterations: 4
        action: {capability: poll, input: {i: "{{ iteration }}"}}
      on:
        - {event: task.completed, goto: done, set: {last: "{{ result.n }}"}}
    done: {type: terminal, outputs: {last: "{{ context.last }}"}}
"""


def test_a_loop_until_reads_the_iteration_the_answer_and_its_result() -> None:
    run = Run(compile_one(LOOP), run_id="p")
    run.start()
    records = run.answer({"ok": True, "n": 1})  # iteration 1: until is false
    assert types(records) == ["action.completed", "action.requested"]
    [again] = [r for r in records if isinstance(r, ev.ActionRequested)]
    assert (again.data.iteration, again.data.input) == (2, {"i": 2})
    run.answer({"ok": True, "n": 2})
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"last": 2}


def answer_failed(data: Any) -> ev.ErrorInfo:
    run = Run(
        compile_one(
            """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: one}
spec:
  initial_state: call
  states:
    call:
      actions: [{capability: call}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
        ),
        run_id="o",
    )
    run.start()
    run.answer(data, type="task.failed")
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    return run.state.error


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("disk full", ev.ErrorInfo(error_class=ErrorClass.AGENT_ERROR, message="disk full")),
        (None, ev.ErrorInfo(error_class=ErrorClass.AGENT_ERROR, message="None")),
        (
            {"error": "flat"},
            ev.ErrorInfo(error_class=ErrorClass.AGENT_ERROR, message="{'error': 'flat'}"),
        ),
        ({"error": {}}, ev.ErrorInfo(error_class=ErrorClass.AGENT_ERROR, message="")),
        (
            {"error": {"class": "timeout", "message": 3}},
            ev.ErrorInfo(error_class=ErrorClass.TIMEOUT, message="3"),
        ),
        (
            {"error": {"class": "mine", "code": "own", "retryable": 1}},
            ev.ErrorInfo(
                error_class=ErrorClass.AGENT_ERROR, message="", retryable=True, code="own"
            ),
        ),
    ],
)
def test_a_failure_in_any_shape_is_read_as_a_classified_error(
    data: Any, expected: ev.ErrorInfo
) -> None:
    assert answer_failed(data) == expected


def test_a_failing_child_run_names_its_parent_in_run_failed() -> None:
    parent = ev.ParentRef(run_id="r-parent", action_id="r-parent:3", attempt=1)
    child = Run(
        compile_one(
            """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: child}
spec:
  initial_state: call
  states:
    call:
      actions: [{capability: call}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
        ),
        run_id="r-child",
    )
    child.start(parent=parent)
    records = child.answer({"error": {"class": "agent_error", "message": "no"}}, type="task.failed")
    [failed] = [r for r in records if isinstance(r, ev.RunFailed)]
    assert failed.data.parent == parent
    assert failed.data.error == ev.ErrorInfo(error_class=ErrorClass.AGENT_ERROR, message="no")


ROUTED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: routed}
spec:
  initial_state: call
  states:
    call:
      actions: [{capability: call}]
      on:
        - {event: task.completed, goto: done}
        - event: task.failed
          guard: 'data.error.code == "quota"'
          goto: later
          set: {why: "{{ result.error.message }} ({{ event.id }})"}
      catch:
        - {errors: ["*"], goto: failed, set: {why: "{{ data.error.message }}"}}
    later: {type: terminal, outputs: {why: "{{ context.why }}"}}
    failed: {type: terminal, outputs: {why: "{{ context.why }}"}}
    done: {type: terminal}
"""


@pytest.mark.parametrize(
    ("code", "end", "why"),
    [("quota", "later", "over quota (answer-1)"), ("other", "failed", "over quota")],
)
def test_a_failure_is_routed_with_the_answer_that_carried_it(code: str, end: str, why: str) -> None:
    run = Run(compile_one(ROUTED), run_id="f")
    run.start()
    run.answer(
        {"error": {"class": "agent_error", "message": "over quota", "code": code}},
        type="task.failed",
    )
    assert (run.state.state, run.state.outputs) == (end, {"why": why})
