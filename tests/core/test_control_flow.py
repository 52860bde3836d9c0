"""Control flow in the engine: retries, catch, timeouts, map, loop, budgets, correlation,
sub-workflow actions and actions cancelled when their state is left."""

from __future__ import annotations

import pytest

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import CapabilityDef, RetryPolicy, link
from interlock.core.engine import (
    Incoming,
    backoff_seconds,
    correlation_key,
    event_correlation_key,
)
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

FETCH = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: fetch}
spec:
  initial_state: fetch
  states:
    fetch:
      actions:
        - capability: fetch
          timeout: 30s
          retry: {max_attempts: 3, backoff: {initial: 1s, multiplier: 2, max: 10s, jitter: false}}
      on:
        - {event: task.completed, goto: done}
        - {event: stop.now, goto: gave_up, set: {why: stopped}}
      catch:
        - {errors: [timeout], goto: gave_up, set: {why: "{{ result.error.message }}"}}
        - {errors: ["*"], goto: gave_up, set: {why: "{{ result.error['class'] }}"}}
    done: {type: terminal}
    gave_up: {type: terminal, outputs: {why: "{{ context.why }}"}}
"""


def fetch_run() -> Run:
    run = Run(compile_one(FETCH), run_id="f")
    records = run.start()
    assert types(records)[-2:] == ["action.requested", "timer.scheduled"]
    return run


def failure(error_class: str, message: str = "", retryable: bool = False) -> dict[str, object]:
    return {"error": {"class": error_class, "message": message, "retryable": retryable}}


def test_a_retryable_failure_schedules_a_retry_after_the_backoff() -> None:
    run = fetch_run()
    records = run.answer(failure("platform_error", "down"), type="task.failed")
    assert types(records) == ["action.failed", "timer.scheduled"]
    failed, timer = records
    assert isinstance(failed, ev.ActionFailed)
    assert failed.data.will_retry is True
    assert isinstance(timer, ev.TimerScheduled)
    assert timer.data.purpose == "retry"
    assert timer.data.attempt == 2
    assert timer.data.fire_at == "2026-01-01T00:00:03.000Z"  # decided at :02, backoff 1 s
    assert run.state.pending == {}
    again = run.fire("retry")
    assert types(again) == ["timer.fired", "action.requested", "timer.scheduled"]
    requested = again[1]
    assert isinstance(requested, ev.ActionRequested)
    assert requested.data.action_id == "f:3"  # the same action, another attempt
    assert requested.data.attempt == 2
    assert run.state.pending["f:3"].attempt == 2


def test_an_answer_to_an_earlier_attempt_is_ignored() -> None:
    run = fetch_run()
    run.answer(failure("timeout"), type="task.failed")
    run.fire("retry")
    late = Incoming(
        type="task.completed",
        source="agent",
        id="late",
        data={},
        extensions={"actionid": "f:3", "attempt": "1"},
    )
    assert run.deliver(late) == []
    current = Incoming(
        type="task.completed",
        source="agent",
        id="now",
        data={},
        extensions={"actionid": "f:3", "attempt": "2"},
    )
    assert types(run.deliver(current))[-1] == "run.completed"


def test_attempts_run_out_then_catch_by_class() -> None:
    run = fetch_run()
    for attempt in (1, 2):
        run.answer(failure("timeout", f"slow {attempt}"), type="task.failed")
        run.fire("retry")
    records = run.answer(failure("timeout", "slow 3"), type="task.failed")
    assert types(records) == [
        "action.failed",
        "transition.fired",
        "state.entered",
        "run.completed",
    ]
    failed, fired = records[0], records[1]
    assert isinstance(failed, ev.ActionFailed)
    assert (failed.data.attempt, failed.data.will_retry) == (3, False)
    assert isinstance(fired, ev.TransitionFired)
    assert (fired.data.event_type, fired.data.transition) == ("task.failed", -1)
    assert run.state.outputs == {"why": "slow 3"}


def test_a_failure_that_is_not_retryable_goes_straight_to_catch() -> None:
    run = fetch_run()
    records = run.answer(failure("schema_error", "bad"), type="task.failed")
    assert types(records)[0] == "action.failed"
    assert "timer.scheduled" not in types(records)
    assert run.state.outputs == {"why": "schema_error"}


def test_the_agent_can_mark_any_error_retryable() -> None:
    run = fetch_run()
    records = run.answer(failure("agent_error", "flaky", retryable=True), type="task.failed")
    assert types(records) == ["action.failed", "timer.scheduled"]


def test_an_action_timeout_fails_the_attempt_as_timeout() -> None:
    run = fetch_run()
    records = run.fire("action-timeout")
    assert types(records) == ["timer.fired", "action.failed", "timer.scheduled"]
    failed = records[1]
    assert isinstance(failed, ev.ActionFailed)
    assert failed.data.error.error_class == "timeout"
    assert failed.data.error.message == "no answer from fetch (deadline 2026-01-01T00:00:31.000Z)"
    # the answer to the attempt that timed out comes too late
    assert run.answer({}, action_id="f:3") == []


def test_a_timer_of_an_attempt_already_answered_does_nothing() -> None:
    run = fetch_run()
    run.answer(failure("platform_error"), type="task.failed")
    stale = next(t for t, v in run.state.timers.items() if v.purpose == "action-timeout")
    run.fire("retry")
    assert types(run.fire("", timer_id=stale)) == ["timer.fired"]
    assert run.state.pending["f:3"].attempt == 2
    assert run.fire("", timer_id="f:999") == []


def test_leaving_a_state_cancels_its_actions_and_timers() -> None:
    run = fetch_run()
    records = run.send("stop.now", {})
    assert types(records) == [
        "event.received",
        "action.cancelled",
        "transition.fired",
        "state.entered",
        "run.completed",
    ]
    cancelled = records[1]
    assert isinstance(cancelled, ev.ActionCancelled)
    assert cancelled.data.action_id == "f:3"
    assert "left state 'fetch'" in cancelled.data.reason
    assert run.state.timers == {}


def test_backoff_is_exponential_capped_and_deterministically_jittered() -> None:
    plain = ev.RetryInfo(max_attempts=9, initial_s=1, multiplier=2, max_s=10, jitter=False)
    assert [backoff_seconds(plain, n, "a") for n in range(1, 6)] == [1, 2, 4, 8, 10]
    jittered = ev.RetryInfo(max_attempts=9, initial_s=1, multiplier=2, max_s=10, jitter=True)
    waits = [backoff_seconds(jittered, n, "r:3") for n in range(1, 6)]
    assert waits == [backoff_seconds(jittered, n, "r:3") for n in range(1, 6)]
    for wait, full in zip(waits, [1, 2, 4, 8, 10], strict=True):
        assert full / 2 <= wait <= full
    assert waits != [backoff_seconds(jittered, n, "r:4") for n in range(1, 6)]


MAP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: fan}
spec:
  budget: {max_fan_out: 4}
  inputs: {files: {type: "list[string]", default: [a, b, c]}}
  initial_state: lint
  states:
    lint:
      map:
        over: inputs.files
        as: file
        action: {capability: lint, input: {file: "{{ file }}", at: "{{ index }}"}}
        parallelism: 2
        completion: %s
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal, outputs: {lint: "$.states.lint.output"}}
"""


def test_map_all_keeps_parallelism_and_input_order() -> None:
    run = Run(compile_one(MAP % "all"), run_id="m")
    records = run.start()
    assert types(records)[-3:] == ["map.started", "action.requested", "action.requested"]
    inputs = [r.data.input for r in records if isinstance(r, ev.ActionRequested)]
    assert inputs == [{"file": "a", "at": 0}, {"file": "b", "at": 1}]
    first, second = list(run.state.pending)
    assert types(run.answer({"n": "b"}, action_id=second)) == [
        "action.completed",
        "action.requested",
    ]
    assert len(run.state.pending) == 2
    third = next(a for a in run.state.pending if a != first)
    run.answer({"n": "c"}, action_id=third)
    records = run.answer({"n": "a"}, action_id=first)
    assert types(records)[:3] == ["action.completed", "map.completed", "transition.fired"]
    assert run.state.outputs == {"lint": [{"n": "a"}, {"n": "b"}, {"n": "c"}]}


def test_map_all_fails_fast_and_cancels_the_rest() -> None:
    run = Run(compile_one(MAP % "all"), run_id="m")
    run.start()
    first = next(iter(run.state.pending))
    records = run.answer(
        failure("agent_error", "lint crashed"), type="task.failed", action_id=first
    )
    assert types(records) == ["action.failed", "action.cancelled", "run.failed"]
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    assert run.state.error == ev.ErrorInfo(
        error_class="agent_error", message="item 0 of map 'lint' failed: lint crashed"
    )
    cancelled = records[1]
    assert isinstance(cancelled, ev.ActionCancelled)
    assert cancelled.data.reason == "map failed fast"


def test_map_any_takes_the_first_success() -> None:
    run = Run(compile_one(MAP % "any"), run_id="m")
    run.start()
    first, second = list(run.state.pending)
    run.answer(failure("agent_error"), type="task.failed", action_id=first)
    records = run.answer({"n": "b"}, action_id=second)
    assert "map.completed" in types(records)
    [cancelled] = [r for r in records if isinstance(r, ev.ActionCancelled)]
    assert cancelled.data.reason == "map completed (any)"  # the third item was in flight
    assert run.state.outputs == {"lint": {"n": "b"}}


def test_map_all_settled_waits_for_every_item_and_reports_each_outcome() -> None:
    run = Run(compile_one(MAP % "all_settled"), run_id="m")
    run.start()
    first, second = list(run.state.pending)
    records = run.answer(
        failure("agent_error", "lint crashed"), type="task.failed", action_id=first
    )
    # A failure neither fails the map nor cancels the item in flight; the next item starts.
    assert types(records) == ["action.failed", "action.requested"]
    third = next(a for a in run.state.pending if a != second)
    run.answer({"n": "c"}, action_id=third)
    assert run.state.state == "lint"
    records = run.answer({"n": "b"}, action_id=second)
    assert types(records)[:3] == ["action.completed", "map.completed", "transition.fired"]
    assert run.state.outputs == {
        "lint": [
            {
                "status": "failed",
                "error": {"class": "agent_error", "message": "lint crashed", "code": ""},
            },
            {"status": "completed", "result": {"n": "b"}},
            {"status": "completed", "result": {"n": "c"}},
        ]
    }


def test_map_all_settled_completes_even_when_every_item_fails() -> None:
    run = Run(compile_one(MAP % "all_settled"), run_id="m")
    run.start({"files": ["a"]})
    run.answer(failure("timeout", "slow"), type="task.failed")
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {
        "lint": [{"status": "failed", "error": {"class": "timeout", "message": "slow", "code": ""}}]
    }


def test_map_over_more_items_than_the_fan_out_budget_fails() -> None:
    run = Run(compile_one(MAP % "all"), run_id="m")
    run.start({"files": list("abcde")})
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    assert run.state.error.error_class == "budget_exceeded"


def test_map_over_an_empty_list_completes_at_once() -> None:
    run = Run(compile_one(MAP % "all"), run_id="m")
    records = run.start({"files": []})
    assert "map.completed" in types(records)
    assert run.state.outputs == {"lint": []}


LOOP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: poll}
spec:
  initial_state: poll
  states:
    poll:
      loop:
        until: result.ready == true
        max_iterations: 3
        action: {capability: status, input: {n: "{{ iteration }}"}}
      on:
        - {event: task.completed, goto: done}
      catch:
        - {errors: [budget_exceeded], goto: gave_up}
    done: {type: terminal, outputs: {last: "$.states.poll.output"}}
    gave_up: {type: terminal}
"""


def test_loop_until_the_predicate_holds() -> None:
    run = Run(compile_one(LOOP), run_id="l")
    records = run.start()
    requested = records[-1]
    assert isinstance(requested, ev.ActionRequested)
    assert (requested.data.input, requested.data.iteration) == ({"n": 1}, 1)
    records = run.answer({"ready": False})
    assert isinstance(records[-1], ev.ActionRequested)
    assert records[-1].data.input == {"n": 2}
    records = run.answer({"waiting": True})  # until errors: recorded, the loop goes on
    assert types(records) == ["action.completed", "guard.failed", "action.requested"]
    failed = records[1]
    assert isinstance(failed, ev.GuardFailed)
    assert (failed.data.event_type, failed.data.transition) == ("loop.until", -1)
    run.answer({"ready": True})
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"last": {"ready": True}}


def test_loop_stops_at_max_iterations_with_budget_exceeded() -> None:
    run = Run(compile_one(LOOP), run_id="l")
    run.start()
    for _ in range(3):
        records = run.answer({"ready": False})
    assert types(records)[-3:] == ["transition.fired", "state.entered", "run.completed"]
    assert run.state.state == "gave_up"


BUDGET = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: ping}
spec:
  budget: {max_transitions: 3, max_actions: 100}
  initial_state: a
  states:
    a: {on: [{event: go, goto: b}, {event: stop, goto: done}]}
    b: {on: [{event: go, goto: a}]}
    done: {type: terminal}
"""


def test_too_many_transitions_fail_the_run() -> None:
    run = Run(compile_one(BUDGET))
    run.start()
    for n in range(3):
        run.send("go", {}, event_id=f"e{n}")
    records = run.send("go", {}, event_id="e3")
    assert types(records) == ["event.received", "run.failed"]
    assert run.state.error is not None
    assert run.state.error.error_class == "budget_exceeded"
    assert "max_transitions (3)" in run.state.error.message


def test_too_many_actions_fail_the_run() -> None:
    run = Run(
        compile_one(
            LOOP.replace("max_iterations: 3", "max_iterations: 9").replace(
                "spec:\n", "spec:\n  budget: {max_actions: 2}\n", 1
            )
        )
    )
    run.start()
    run.answer({"ready": False})
    records = run.answer({"ready": False})
    assert types(records)[-1] == "run.failed"
    assert run.state.error is not None
    assert run.state.error.error_class == "budget_exceeded"


STATE_TIMEOUT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: wait}
spec:
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      timeout: {after: 1h, goto: expired, set: {why: "no answer in time"}}
      on:
        - {event: approval.granted, goto: done}
        - {event: nudge, goto: wait}
    done: {type: terminal}
    expired: {type: terminal, outputs: {why: "{{ context.why }}"}}
"""


def test_a_state_timeout_moves_on() -> None:
    run = Run(compile_one(STATE_TIMEOUT), run_id="w")
    records = run.start()
    timer = records[-1]
    assert isinstance(timer, ev.TimerScheduled)
    assert (timer.data.purpose, timer.data.fire_at) == ("state-timeout", "2026-01-01T01:00:01.000Z")
    records = run.fire("state-timeout")
    fired = records[1]
    assert isinstance(fired, ev.TransitionFired)
    assert (fired.data.event_type, fired.data.to_state) == ("state.timeout", "expired")
    assert run.state.outputs == {"why": "no answer in time"}


def test_re_entering_a_state_restarts_its_timeout() -> None:
    run = Run(compile_one(STATE_TIMEOUT), run_id="w")
    run.start()
    first = next(iter(run.state.timers))
    run.send("nudge", {})
    assert first not in run.state.timers
    assert run.fire("", timer_id=first) == []
    assert len(run.state.timers) == 1


CORRELATED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: order}
spec:
  inputs: {order: {type: string, required: true}}
  correlate:
    key: "order-{{ inputs.order }}"
    events:
      payment.received: '"order-" + data.order_id'
      parcel.shipped: 'data.ref'
  initial_state: wait
  states:
    wait: {on: [{event: payment.received, goto: done}]}
    done: {type: terminal}
"""


def test_correlation_keys_from_inputs_and_events() -> None:
    definition = compile_one(CORRELATED)
    assert correlation_key(definition, {"order": "42"}) == "order-42"
    run = Run(definition)
    records = run.start({"order": "42"})
    started = records[0]
    assert isinstance(started, ev.RunStarted)
    assert started.data.correlation_key == "order-42"
    paid = Incoming(type="payment.received", source="s", id="1", data={"order_id": "42"})
    assert event_correlation_key(definition, paid) == "order-42"
    shipped = Incoming(type="parcel.shipped", source="s", id="2", data={"nothing": 1})
    assert event_correlation_key(definition, shipped) is None  # an error gives no key
    other = Incoming(type="other", source="s", id="3", data={})
    assert event_correlation_key(definition, other) is None


def test_a_key_that_renders_null_is_no_key() -> None:
    """Not the text "None": a run started with a null key is indexed under no key."""
    definition = compile_one(
        CORRELATED.replace('"order-{{ inputs.order }}"', '"{{ inputs.ref }}"').replace(
            "{order: {type: string, required: true}}", "{order: {type: string}, ref: {}}"
        )
    )
    assert correlation_key(definition, {"ref": None}) is None
    assert correlation_key(definition, {"ref": 7}) == "7"
    started = Run(definition).start({"ref": None})[0]
    assert isinstance(started, ev.RunStarted)
    assert started.data.correlation_key is None


def test_a_sub_workflow_action_is_requested_and_answered_like_any_action() -> None:
    definition = compile_one(
        FETCH.replace("- capability: fetch", "- workflow: ops/fetch-all").replace(
            "          retry:", "          x-retry:"
        )
    )
    run = Run(definition, run_id="p")
    records = run.start()
    requested = next(r for r in records if isinstance(r, ev.ActionRequested))
    assert requested.data.workflow == "ops/fetch-all"
    assert requested.data.capability == ""
    assert definition.capabilities() == frozenset()
    run.answer({"fetched": 3})
    assert run.state.status == RunStatus.COMPLETED


def test_link_fills_timeout_and_retries_from_the_agentdef() -> None:
    definition = compile_one(
        FETCH.replace("          timeout: 30s\n", "").replace(
            "          retry:", "          x-retry:"
        )
    )
    assert definition.states["fetch"].actions[0].timeout_s is None
    linked = link(definition, {"fetch": CapabilityDef("fetch", timeout_s=5, max_retries=2)})
    action = linked.states["fetch"].actions[0]
    assert action.timeout_s == 5
    assert action.retry is not None
    assert action.retry.max_attempts == 3
    explicit = link(compile_one(FETCH), {"fetch": CapabilityDef("fetch", timeout_s=5)})
    assert explicit.states["fetch"].actions[0].timeout_s == 30
    # A retry policy written in the manifest is kept over the AgentDef's max_retries.
    written = compile_one(FETCH).states["fetch"].actions[0].retry
    assert written is not None
    assert written.max_attempts == 3
    kept = link(compile_one(FETCH), {"fetch": CapabilityDef("fetch", max_retries=5)})
    assert kept.states["fetch"].actions[0].retry == written


@pytest.mark.parametrize("version", ["interlock.io/v1", "zynax.io/v1"])
def test_control_flow_is_part_of_both_api_versions(version: str) -> None:
    definition = compile_one(FETCH.replace("interlock.io/v1", version))
    assert definition.states["fetch"].catches


RETRIED_MAP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: fan}
spec:
  initial_state: lint
  states:
    lint:
      map:
        over: "['a', 'b', 'c', 'd']"
        as: f
        action: {capability: lint, retry: {max_attempts: 2, backoff: {jitter: false}}}
        parallelism: 2
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_map_parallelism_holds_while_an_item_waits_for_its_retry() -> None:
    run = Run(compile_one(RETRIED_MAP), run_id="m")
    run.start()
    first, second = list(run.state.pending)
    run.answer(failure("platform_error"), type="task.failed", action_id=first)
    run.answer({"ok": 1}, action_id=second)
    run.fire("retry")
    assert len(run.state.pending) <= 2


PARALLEL = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: checks}
spec:
  inputs: {commit: {type: string, default: abc}}
  initial_state: checks
  states:
    checks:
      parallel:
        completion: %s
        actions:
          - {capability: lint, input: {commit: "{{ inputs.commit }}", at: "{{ index }}"}}
          - {capability: test, input: {commit: "{{ inputs.commit }}"}}
          - {capability: scan, input: {deep: true}}
      on:
        - {event: task.completed, goto: done}
      catch:
        - {errors: ["*"], goto: blocked, set: {why: "{{ result.error.message }}"}}
    done: {type: terminal, outputs: {checks: "$.states.checks.output"}}
    blocked: {type: terminal, outputs: {why: "{{ context.why }}"}}
"""


def test_parallel_requests_every_action_at_once_and_joins_in_order() -> None:
    run = Run(compile_one(PARALLEL % "all"), run_id="p")
    records = run.start()
    requested = [r.data for r in records if isinstance(r, ev.ActionRequested)]
    assert [(a.capability, a.item, a.input) for a in requested] == [
        ("lint", 0, {"commit": "abc", "at": 0}),
        ("test", 1, {"commit": "abc"}),
        ("scan", 2, {"deep": True}),
    ]
    lint, test, scan = (a.action_id for a in requested)
    run.answer({"ok": "scan"}, action_id=scan)
    run.answer({"ok": "lint"}, action_id=lint)
    assert run.state.state == "checks"
    records = run.answer({"ok": "test"}, action_id=test)
    assert "map.completed" in types(records)
    assert run.state.outputs == {"checks": [{"ok": "lint"}, {"ok": "test"}, {"ok": "scan"}]}


def test_parallel_all_fails_fast_into_catch() -> None:
    run = Run(compile_one(PARALLEL % "all"), run_id="p")
    run.start()
    test = next(p for p, v in run.state.pending.items() if v.capability == "test")
    records = run.answer(failure("agent_error", "tests red"), type="task.failed", action_id=test)
    assert types(records)[:3] == ["action.failed", "action.cancelled", "action.cancelled"]
    assert run.state.outputs == {"why": "action 1 of parallel 'checks' failed: tests red"}


def test_parallel_all_settled_reports_each_action() -> None:
    run = Run(compile_one(PARALLEL % "all_settled"), run_id="p")
    run.start()
    by_capability = {v.capability: p for p, v in run.state.pending.items()}
    run.answer(failure("timeout", "slow"), type="task.failed", action_id=by_capability["scan"])
    run.answer({"ok": 1}, action_id=by_capability["lint"])
    run.answer({"ok": 2}, action_id=by_capability["test"])
    assert run.state.outputs == {
        "checks": [
            {"status": "completed", "result": {"ok": 1}},
            {"status": "completed", "result": {"ok": 2}},
            {"status": "failed", "error": {"class": "timeout", "message": "slow", "code": ""}},
        ]
    }


def test_parallel_with_actions_too_is_a_state_kind_error() -> None:
    text = PARALLEL.replace(
        "      parallel:", "      actions: [{capability: lint}]\n      parallel:"
    )
    compiled = compile_sources([("p.yaml", text % "all")])
    assert [d.rule for d in compiled.diagnostics] == ["state-kind"]


def test_an_item_waiting_for_its_retry_takes_exactly_one_slot() -> None:
    run = Run(compile_one(RETRIED_MAP.replace("parallelism: 2", "parallelism: 3")), run_id="m")
    run.start()
    first, second, _third = list(run.state.pending)
    assert types(run.answer(failure("platform_error"), type="task.failed", action_id=first)) == [
        "action.failed",
        "timer.scheduled",
    ]
    # Two in flight and one waiting: the freed slot is taken by the fourth item.
    assert types(run.answer({"ok": 1}, action_id=second)) == [
        "action.completed",
        "action.requested",
    ]
    assert sorted(p.item for p in run.state.pending.values()) == [2, 3]  # type: ignore[type-var]


def test_a_map_out_of_action_budget_fails_the_run_once() -> None:
    definition = compile_one(
        MAP.replace("max_fan_out: 4", "max_fan_out: 4, max_actions: 1") % "all"
    )
    run = Run(definition, run_id="m")
    assert types(run.start())[2:] == [
        "map.started",
        "action.requested",
        "action.cancelled",
        "run.failed",
    ]
    assert run.state.error == ev.ErrorInfo(
        error_class="budget_exceeded", message="more than budget.max_actions (1) actions"
    )
    cancelled = run.log[-2]
    assert isinstance(cancelled, ev.ActionCancelled)
    assert cancelled.data.reason == "run failed: budget_exceeded"


def test_link_reaches_the_actions_of_maps_loops_and_parallel_states_only_where_unset() -> None:
    capabilities = {
        "lint": CapabilityDef("lint", timeout_s=7, max_retries=1),
        "status": CapabilityDef("status", timeout_s=9),  # no retries: no policy
        "test": CapabilityDef("test", timeout_s=11, max_retries=4),
        "fetch": CapabilityDef("fetch", timeout_s=5, max_retries=2),
    }
    mapped = link(compile_one(MAP % "all"), capabilities).states["lint"].map
    assert mapped is not None
    assert (mapped.action.timeout_s, mapped.action.retry) == (7, RetryPolicy(max_attempts=2))
    looped = link(compile_one(LOOP), capabilities).states["poll"].loop
    assert looped is not None
    assert (looped.action.timeout_s, looped.action.retry) == (9, None)
    parallel = link(compile_one(PARALLEL % "all"), capabilities).states["checks"].map
    assert parallel is not None
    assert [(b.capability, b.timeout_s, b.retry) for b in parallel.branches] == [
        ("lint", 7, RetryPolicy(max_attempts=2)),
        ("test", 11, RetryPolicy(max_attempts=5)),
        ("scan", None, None),  # no AgentDef known for it: left as written
    ]
    # A policy written in the manifest stays; a child workflow's action takes nothing.
    [explicit] = link(compile_one(FETCH), capabilities).states["fetch"].actions
    assert explicit.retry is not None
    assert (explicit.timeout_s, explicit.retry.max_attempts) == (30, 3)
    child = compile_one(
        FETCH.replace("- capability: fetch", "- workflow: fetch").replace(
            "          timeout: 30s\n", ""
        )
    )
    [untouched] = link(child, capabilities).states["fetch"].actions
    assert untouched.timeout_s is None


def test_the_capabilities_a_workflow_needs_include_its_maps_loops_and_parallel_actions() -> None:
    assert compile_one(MAP % "all").capabilities() == {"lint"}
    assert compile_one(LOOP).capabilities() == {"status"}
    assert compile_one(PARALLEL % "all").capabilities() == {"lint", "test", "scan"}
    assert compile_one(FETCH).capabilities() == {"fetch"}
