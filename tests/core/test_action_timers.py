"""An action with a ``timeout`` schedules its timer together with the request, and the
timer names the same action: its state, id, attempt, position among the state's actions,
a loop's iteration or a DAG's step (what ``interlock timers`` and the explain views show)."""

from __future__ import annotations

from interlock.core import events as ev
from interlock.core.vocabulary import TimerPurpose
from support.core import Run, compile_one

FLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: timed}
spec:
  initial_state: first
  states:
    first:
      actions: [{capability: a}, {capability: b, timeout: 5s}]
      on: [{event: task.completed, goto: poll}]
    poll:
      loop:
        until: "iteration >= 2"
        max_iterations: 3
        action: {capability: status, timeout: 7s}
      on: [{event: task.completed, goto: build}]
    build:
      dag:
        steps:
          compile: {action: {capability: cc, timeout: 9s}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_each_timed_request_schedules_a_timer_for_that_very_action() -> None:
    run = Run(compile_one(FLOW))
    run.start()
    while run.state.pending:
        run.answer({})
    assert run.state.status == "completed"
    requests = {
        r.data.action_id: r.data
        for r in run.log
        if isinstance(r, ev.ActionRequested) and r.data.timeout_s is not None
    }
    timers = [r.data for r in run.log if isinstance(r, ev.TimerScheduled)]
    assert [t.purpose for t in timers] == [TimerPurpose.ACTION_TIMEOUT] * 4
    assert [t.action_id for t in timers] == list(requests)
    seen = [(t.state, t.attempt, t.index, t.item, t.iteration, t.step) for t in timers]
    assert seen == [
        ("first", 1, 1, None, None, None),
        ("poll", 1, 0, None, 1, None),
        ("poll", 1, 0, None, 2, None),
        ("build", 1, 0, None, None, "compile"),
    ]
    for timer in timers:
        request = requests[timer.action_id or ""]
        assert (timer.state, timer.index, timer.iteration, timer.step) == (
            request.state,
            request.index,
            request.iteration,
            request.step,
        )
        assert timer.fire_at == request.deadline
