"""The guards an event is weighed against, as ``interlock explain`` shows them: each entry
tried in order with its outcome, the value the guard gave and what it read; a catch entry
with the failure's class (and its code when the entry filters on codes). Tracing changes
no record."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.engine import GuardCheck, decide
from interlock.core.incoming import Incoming
from support.core import Run, compile_one

FLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: graded}
spec:
  initial_state: grade
  states:
    grade:
      actions: [{capability: echo}]
      on:
        - {event: task.completed, guard: "result.score > 5", goto: high}
        - {event: task.completed, guard: "result.score", goto: odd}
        - {event: task.completed, goto: low}
        - {event: task.failed, guard: 'result.error.code == "late"', goto: late}
      catch:
        - {errors: [agent_error], codes: [tool_error], goto: tool}
        - {errors: ["*"], goto: low}
    high: {type: terminal}
    odd: {type: terminal}
    low: {type: terminal}
    late: {type: terminal}
    tool: {type: terminal}
"""
DEFINITION = compile_one(FLOW)
HIGH = "result.score > 5"
LATE = 'result.error.code == "late"'


def weigh(data: Any, type: str = "task.completed") -> tuple[list[GuardCheck], list[Any]]:
    """The guard checks of the answer ``data`` to the first action, and the records."""
    run = Run(DEFINITION)
    run.start()
    answer = Incoming(
        type=type,
        source="interlock://agent/test",
        id="answer-1",
        data=data,
        extensions={"actionid": run.pending_id()},
    )
    now = run.now()
    trace: list[GuardCheck] = []
    records = decide(DEFINITION, run.state, answer, now, trace=trace)
    assert records == decide(DEFINITION, run.state, answer, now)  # the same, untraced
    return trace, records


def check(transition: int, goto: str, guard: str | None, outcome: str, **kw: Any) -> GuardCheck:
    event_type = "task.failed" if transition in (-1, 3) else "task.completed"
    return GuardCheck("grade", event_type, transition, goto, guard, outcome, **kw)


def test_false_and_non_boolean_guards_are_passed_over_with_what_they_read() -> None:
    trace, records = weigh({"score": 3})
    assert trace == [
        check(0, "high", HIGH, "false", value=False, reads={"result.score": 3}),
        check(1, "odd", "result.score", "not_boolean", value=3, reads={"result.score": 3}),
        check(2, "low", None, "fired"),
    ]
    [failed] = [r.data for r in records if isinstance(r, ev.GuardFailed)]
    assert failed == ev.GuardFailedData(
        state="grade",
        transition=1,
        event_type="task.completed",
        guard="result.score",
        error="guard gave int 3, not a boolean",
    )
    assert records[-1].data.state == "low"


def test_a_guard_that_errors_is_reported_with_its_error() -> None:
    trace, records = weigh({})
    error = "no such member in mapping: 'score'"
    absent = {"result.score": "<absent>"}
    assert trace == [
        check(0, "high", HIGH, "error", error=error, reads=absent),
        check(1, "odd", "result.score", "error", error=error, reads=absent),
        check(2, "low", None, "fired"),
    ]
    failed = [r.data for r in records if isinstance(r, ev.GuardFailed)]
    assert [(f.transition, f.guard, f.error) for f in failed] == [
        (0, HIGH, error),
        (1, "result.score", error),
    ]


def test_the_first_guard_that_holds_fires_and_the_rest_are_not_weighed() -> None:
    trace, _ = weigh({"score": 9})
    assert trace == [check(0, "high", HIGH, "fired", value=True, reads={"result.score": 9})]


def failure(code: str) -> dict[str, Any]:
    return {"error": {"class": "agent_error", "message": "broke", "code": code}}


@pytest.mark.parametrize(
    ("code", "goto", "reads"),
    [
        (
            "tool_error",
            "tool",
            {"result.error.class": "agent_error", "result.error.code": "tool_error"},
        ),
        ("other", "low", {"result.error.class": "agent_error"}),
    ],
)
def test_a_catch_entry_reports_the_class_and_the_code_it_filtered_on(
    code: str, goto: str, reads: dict[str, str]
) -> None:
    trace, records = weigh(failure(code), type="task.failed")
    on = check(3, "late", LATE, "false", value=False, reads={"result.error.code": code})
    assert trace == [on, check(-1, goto, None, "fired", reads=reads)]
    fired = [r.data for r in records if isinstance(r, ev.TransitionFired)]
    assert [(f.to_state, f.transition, f.event_type) for f in fired] == [(goto, -1, "task.failed")]


def test_a_failure_taken_by_an_on_entry_goes_no_further() -> None:
    trace, records = weigh(failure("late"), type="task.failed")
    assert trace == [
        check(3, "late", LATE, "fired", value=True, reads={"result.error.code": "late"})
    ]
    fired = [r.data for r in records if isinstance(r, ev.TransitionFired)]
    assert [(f.to_state, f.transition) for f in fired] == [("late", 3)]
