"""The engine's error branches, each with its class and message: a map whose ``over`` fails
or is not a list, a map ``any`` whose items all fail, outputs and fail messages that do not
render, an action's input that does not render, the fan-out bound at its edge, and retry
policies of one attempt."""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.vocabulary import ErrorClass, RunStatus
from support.core import Run, compile_one, types

MAP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: fan}
spec:
  budget: {max_fan_out: 3}
  inputs: {files: {type: any, default: [a, b]}}
  initial_state: lint
  states:
    lint:
      map:
        over: %s
        as: file
        action: {capability: lint, input: {file: "{{ file }}"}}
        parallelism: 3
        completion: %s
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal, outputs: {lint: "$.states.lint.output"}}
"""


def failure(error_class: str, message: str) -> dict[str, Any]:
    return {"error": {"class": error_class, "message": message}}


def failed_with(run: Run) -> tuple[str, str]:
    assert run.state.status == RunStatus.FAILED, run.state.status
    assert run.state.error is not None
    return run.state.error.error_class, run.state.error.message


def test_a_map_over_that_fails_to_evaluate_fails_the_run() -> None:
    run = Run(compile_one(MAP % ("inputs.files.deeper", "all")), run_id="m")
    records = run.start({"files": {"other": 1}})
    assert types(records)[-1] == "run.failed"
    assert "map.started" not in types(records)
    assert failed_with(run) == (
        ErrorClass.EXPRESSION_ERROR,
        "map over of state 'lint': no such member in mapping: 'deeper'",
    )


def test_a_map_over_that_is_not_a_list_fails_the_run() -> None:
    run = Run(compile_one(MAP % ("inputs.files", "all")), run_id="m")
    run.start({"files": "abc"})
    assert failed_with(run) == (
        ErrorClass.EXPRESSION_ERROR,
        "map over of state 'lint' gave str, not a list",
    )
    run = Run(compile_one(MAP % ("inputs.files", "all")), run_id="m")
    run.start({"files": {"a": 1}})
    assert failed_with(run)[1] == "map over of state 'lint' gave dict, not a list"


def test_the_fan_out_budget_admits_exactly_its_bound() -> None:
    run = Run(compile_one(MAP % ("inputs.files", "all")), run_id="m")
    records = run.start({"files": ["a", "b", "c"]})  # max_fan_out is 3
    assert types(records).count("action.requested") == 3
    assert run.state.status == RunStatus.RUNNING
    run = Run(compile_one(MAP % ("inputs.files", "all")), run_id="m")
    records = run.start({"files": ["a", "b", "c", "d"]})
    assert "map.started" not in types(records)
    assert failed_with(run) == (
        ErrorClass.BUDGET_EXCEEDED,
        "map over 4 items is above budget.max_fan_out (3)",
    )


def test_a_map_any_whose_items_all_fail_fails_with_the_last_item() -> None:
    run = Run(compile_one(MAP % ("inputs.files", "any")), run_id="m")
    run.start({"files": ["a", "b", "c"]})
    first, second, third = list(run.state.pending)
    # Out of order: the last to fail is item 1, but the error kept is item 2's (by position).
    run.answer(failure("schema_error", "c is odd"), type="task.failed", action_id=third)
    assert run.state.status == RunStatus.RUNNING
    run.answer(failure("agent_error", "a broke"), type="task.failed", action_id=first)
    records = run.answer(failure("timeout", "b slow"), type="task.failed", action_id=second)
    assert types(records) == ["action.failed", "run.failed"]
    assert failed_with(run) == (
        ErrorClass.SCHEMA_ERROR,
        "every item of map 'lint' failed; last: c is odd",
    )


def test_a_map_any_with_one_success_among_failures_completes() -> None:
    run = Run(compile_one(MAP % ("inputs.files", "any")), run_id="m")
    run.start({"files": ["a", "b"]})
    first, second = list(run.state.pending)
    run.answer(failure("agent_error", "a broke"), type="task.failed", action_id=first)
    run.answer({"ok": "b"}, action_id=second)
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"lint": {"ok": "b"}}


ENDS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: ends}
spec:
  initial_state: wait
  states:
    wait:
      on:
        - {event: go.out, goto: out}
        - {event: go.fail, goto: fail}
    out:
      type: terminal
      outputs: {fine: 1, bad: "{{ context.nothing.here }}"}
    fail:
      type: terminal
      fail: {message: "no: {{ context.nothing.here }}", class: schema_error}
"""


def test_an_output_that_does_not_render_fails_the_run() -> None:
    run = Run(compile_one(ENDS), run_id="e")
    run.start()
    records = run.send("go.out")
    assert types(records)[-1] == "run.failed"
    assert failed_with(run) == (
        ErrorClass.EXPRESSION_ERROR,
        "output 'bad' of state 'out': no such member in mapping: 'nothing'",
    )
    assert run.state.outputs is None


def test_a_fail_message_that_does_not_render_fails_the_run_as_an_expression_error() -> None:
    run = Run(compile_one(ENDS), run_id="e")
    run.start()
    run.send("go.fail")
    assert failed_with(run) == (
        ErrorClass.EXPRESSION_ERROR,
        "fail message of state 'fail': no such member in mapping: 'nothing'",
    )


INPUT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: inputs}
spec:
  initial_state: work
  states:
    work:
      actions:
        - {capability: fetch}
        - {capability: use, input: {value: "{{ context.nothing.here }}"}}
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal}
"""


def test_an_action_input_that_does_not_render_fails_the_run_and_asks_for_nothing() -> None:
    run = Run(compile_one(INPUT), run_id="i")
    run.start()
    records = run.answer({})
    assert types(records) == ["action.completed", "run.failed"]
    assert failed_with(run) == (
        ErrorClass.EXPRESSION_ERROR,
        "input of action 1 in state 'work': no such member in mapping: 'nothing'",
    )
    assert run.state.pending == {}


RETRY = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: once}
spec:
  initial_state: call
  states:
    call:
      actions:
        - capability: call
          retry: {max_attempts: %d, backoff: {initial: 1s, jitter: false}}
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal}
"""


def test_one_attempt_is_no_retry_policy_at_all() -> None:
    run = Run(compile_one(RETRY % 1), run_id="o")
    [requested] = [r for r in run.start() if isinstance(r, ev.ActionRequested)]
    assert requested.data.retry is None
    records = run.answer(failure("platform_error", "down"), type="task.failed")
    assert types(records) == ["action.failed", "run.failed"]
    assert isinstance(records[0], ev.ActionFailed)
    assert records[0].data.will_retry is False
    assert failed_with(run) == (ErrorClass.PLATFORM_ERROR, "down")


def test_two_attempts_retry_once() -> None:
    run = Run(compile_one(RETRY % 2), run_id="o")
    [requested] = [r for r in run.start() if isinstance(r, ev.ActionRequested)]
    assert requested.data.retry == ev.RetryInfo(max_attempts=2, initial_s=1.0, jitter=False)
    records = run.answer(failure("platform_error", "down"), type="task.failed")
    assert types(records) == ["action.failed", "timer.scheduled"]
    run.fire("retry")
    records = run.answer(failure("platform_error", "down again"), type="task.failed")
    assert types(records) == ["action.failed", "run.failed"]
    assert failed_with(run) == (ErrorClass.PLATFORM_ERROR, "down again")
