"""What a run writes when a timer fires or an attempt fails, beyond the route it takes: a
deadline's and a state timeout's `set` rendered from the run as it stood, and a failed
attempt of a loop iteration or of a state's later action retried as that same iteration
or action."""

from __future__ import annotations

from test_spawn_budgets import PARENT, _child, _parent, _report, _requested

from interlock.core import events as ev
from interlock.core.engine import Incoming
from support.core import Run, compile_one

TIMED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: timed}
spec:
  deadline: {after: 1d, goto: late, set: {stuck_in: "{{ run.state }}"}}
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      timeout: {after: 1h, goto: second, set: {waited: "{{ run.id }}/{{ run.state }}"}}
      on:
        - {event: go, goto: done}
    second:
      type: human_in_the_loop
      on:
        - {event: go, goto: done}
    late:
      type: terminal
      outputs: {stuck_in: "{{ context.stuck_in }}", waited: "{{ context.waited }}"}
    done: {type: terminal}
"""


def test_a_state_timeout_and_the_deadline_render_their_set_from_the_run() -> None:
    run = Run(compile_one(TIMED))
    run.start()
    moved = run.fire("state-timeout")
    fired = next(r for r in moved if isinstance(r, ev.TransitionFired))
    assert (fired.data.event_type, fired.data.set) == ("state.timeout", {"waited": "r-test/wait"})
    assert run.state.state == "second"
    late = run.fire("run-deadline")
    fired = next(r for r in late if isinstance(r, ev.TransitionFired))
    assert (fired.data.event_type, fired.data.set) == ("run.deadline", {"stuck_in": "second"})
    assert run.state.outputs == {"stuck_in": "second", "waited": "r-test/wait"}


LOOPED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: looped}
spec:
  initial_state: poll
  states:
    poll:
      loop:
        until: result.ready == true
        max_iterations: 3
        action:
          capability: status
          input: {n: "{{ iteration }}"}
          retry: {max_attempts: 2, backoff: {initial: 1s, jitter: false}}
      on:
        - {event: task.completed, goto: two}
    two:
      actions:
        - {capability: build}
        - capability: publish
          retry: {max_attempts: 2, backoff: {initial: 1s, jitter: false}}
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal}
"""


def _failed(run: Run) -> list[ev.AnyRecord]:
    return run.answer({"error": {"class": "timeout", "message": "slow"}}, type="task.failed")


def test_a_failed_loop_iteration_is_retried_as_the_same_iteration() -> None:
    run = Run(compile_one(LOOPED))
    run.start()
    run.answer({"ready": False})
    records = _failed(run)
    failed = next(r for r in records if isinstance(r, ev.ActionFailed))
    scheduled = next(r for r in records if isinstance(r, ev.TimerScheduled))
    assert (failed.data.iteration, failed.data.will_retry) == (2, True)
    assert (scheduled.data.purpose, scheduled.data.iteration) == ("retry", 2)
    [again] = [r for r in run.fire("retry") if isinstance(r, ev.ActionRequested)]
    assert (again.data.iteration, again.data.attempt, again.data.input) == (2, 2, {"n": 2})


def test_a_failed_later_action_is_retried_as_that_action() -> None:
    run = Run(compile_one(LOOPED))
    run.start()
    run.answer({"ready": True})
    run.answer({})  # build
    records = _failed(run)  # publish
    failed = next(r for r in records if isinstance(r, ev.ActionFailed))
    scheduled = next(r for r in records if isinstance(r, ev.TimerScheduled))
    assert (failed.data.index, scheduled.data.index) == (1, 1)
    [again] = [r for r in run.fire("retry") if isinstance(r, ev.ActionRequested)]
    assert (again.data.index, again.data.capability, again.data.attempt) == (1, "publish", 2)


def test_a_failed_child_run_is_charged_what_it_spent() -> None:
    parent = _parent("max_total_spawns: 6")
    parent.start()
    parent.answer({})  # prep: 1 spawn; the child run is the 2nd, handed the other 4
    child = _child(_requested(parent).data.spawn)
    child.answer({"error": {"class": "agent_error", "message": "no"}}, type="task.failed")
    end = child.log[-1]
    assert isinstance(end, ev.RunFailed)
    assert end.data.spawns == 1
    _report(parent, child)
    failed = [r for r in parent.log if isinstance(r, ev.ActionFailed)][-1]
    assert failed.data.spawns == 1
    # The reservation of 4 is released: 1 (prep) + 1 (the child run) + 1 (its action).
    assert parent.state.spawn is not None
    assert (parent.state.spawn.used, parent.state.spawn.held) == (3, {})


COSTLY = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: costly}
spec:
  budget: {max_cost: 5}
  initial_state: ask
  states:
    ask:
      parallel:
        actions: [{capability: model.big}, {capability: model.other}]
      on:
        - {event: task.completed, goto: done}
      catch:
        - {errors: [budget_exceeded], codes: [max_cost], goto: cheap}
    cheap:
      actions: [{capability: model.small}]
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal, outputs: {spent: "{{ run.cost }}"}}
"""


def test_spending_exactly_the_cost_budget_is_within_it() -> None:
    run = Run(compile_one(COSTLY))
    run.start()
    first, second = run.state.pending
    run.answer({"cost": 2}, action_id=first)
    run.answer({"cost": 3}, action_id=second)
    assert run.state.state == "done"
    assert run.state.outputs == {"spent": 5.0}


def test_the_answer_over_the_cost_budget_cancels_the_rest_and_is_routed_only_as_a_failure() -> None:
    run = Run(compile_one(COSTLY))
    run.start()
    first, _ = run.state.pending
    records = run.answer({"cost": 5.5}, action_id=first)
    [cancelled] = [r for r in records if isinstance(r, ev.ActionCancelled)]
    assert cancelled.data.reason == "budget.max_cost (5) exceeded"
    # The catch took the run to `cheap`, which waits for its own answer.
    assert run.state.state == "cheap"
    [pending] = run.state.pending.values()
    assert pending.capability == "model.small"
    assert [r.data.to_state for r in records if isinstance(r, ev.TransitionFired)] == ["cheap"]


def test_a_child_run_that_does_not_answer_in_time_fails_its_action_with_nothing_spent() -> None:
    text = PARENT.replace("@BUDGET@", "max_total_spawns: 6").replace(
        "actions: [{workflow: child}]", "actions: [{workflow: child, timeout: 1m}]"
    )
    parent = Run(compile_one(text), "r-parent")
    parent.start()
    parent.answer({})
    records = parent.fire("action-timeout")
    failed = next(r for r in records if isinstance(r, ev.ActionFailed))
    assert (failed.data.error.error_class, failed.data.spawns) == ("timeout", None)


def test_a_run_without_a_cost_budget_records_no_cost() -> None:
    run = Run(compile_one(COSTLY.replace("  budget: {max_cost: 5}\n", "")))
    run.start()
    first, _ = run.state.pending
    [completed] = [
        r for r in run.answer({"cost": 7}, action_id=first) if isinstance(r, ev.ActionCompleted)
    ]
    assert completed.data.cost is None
    assert run.state.cost is None


def test_an_answer_of_its_own_type_routes_with_its_event() -> None:
    text = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: own}
spec:
  initial_state: ask
  states:
    ask:
      actions: [{capability: model.big}]
      on:
        - {event: model.refused, goto: refused}
        - {event: task.completed, goto: done}
    refused: {type: terminal}
    done: {type: terminal}
"""
    run = Run(compile_one(text))
    run.start()
    records = run.answer({"why": "policy"}, type="model.refused", event_id="a-9")
    [fired] = [r for r in records if isinstance(r, ev.TransitionFired)]
    assert (fired.data.event_type, fired.data.event_id, fired.data.to_state) == (
        "model.refused", "a-9", "refused",
    )  # fmt: skip


def test_a_childs_spawn_count_is_read_only_as_a_number_of_up_to_nine_digits() -> None:
    for value, spawns in [("999999999", 999999999), ("1000000000", None), ("2x", None)]:
        parent = _parent("max_total_spawns: 6")
        parent.start()
        parent.answer({})
        parent.deliver(
            Incoming(
                type="task.completed",
                source="interlock://runs/r-child",
                id="r-child.end",
                data={},
                extensions={"actionid": parent.pending_id(), "attempt": "1", "spawns": value},
            )
        )
        completed = [r for r in parent.log if isinstance(r, ev.ActionCompleted)][-1]
        assert completed.data.spawns == spawns, value
