"""The engine: start, decide and cancel, one behaviour per test."""

from __future__ import annotations

import pytest

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.engine import Incoming, decide
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

ROUTING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: routing}
spec:
  context: {seen: 0}
  initial_state: score
  states:
    score:
      actions:
        - capability: review
          output: {score: last_score, summary: last_summary}
      on:
        - event: task.completed
          guard: result.score > 7
          goto: high
          set: {band: high, twice: "{{ result.score * 2 }}"}
        - event: task.completed
          guard: result.score > 3
          goto: mid
          set: {band: mid}
        - event: task.completed
          goto: low
        - event: review.approved
          goto: approved
          set: {by: "{{ result.by }}"}
        - event: task.failed
          guard: result.error["class"] == "timeout"
          goto: low
    high: {type: terminal, outputs: {band: "{{ context.band }}"}}
    mid: {type: terminal, outputs: {band: "{{ context.band }}"}}
    low: {type: terminal}
    approved: {type: terminal, outputs: {by: "{{ context.by }}"}}
"""


def run_routing() -> Run:
    run = Run(compile_one(ROUTING))
    run.start()
    return run


def test_start_records_started_then_entered_then_the_first_action() -> None:
    run = Run(compile_one(ROUTING), run_id="r1")
    records = run.start()
    assert types(records) == ["run.started", "state.entered", "action.requested"]
    assert [r.id for r in records] == ["r1:1", "r1:2", "r1:3"]
    assert all(r.subject == "r1" and r.source == ev.SOURCE for r in records)
    started = records[0]
    assert isinstance(started, ev.RunStarted)
    assert started.data.workflow == "routing"
    assert started.data.spec_hash.startswith("sha256:")
    assert started.data.context == {"seen": 0}
    requested = records[2]
    assert isinstance(requested, ev.ActionRequested)
    assert requested.data.action_id == "r1:3"
    assert requested.data.capability == "review"
    assert run.state.status == RunStatus.RUNNING
    assert run.state.state == "score"
    assert list(run.state.pending) == ["r1:3"]


@pytest.mark.parametrize(
    ("score", "target", "transition"),
    [(9, "high", 0), (8.5, "high", 0), (5, "mid", 1), (1, "low", 2)],
)
def test_first_matching_transition_wins_in_order(
    score: float, target: str, transition: int
) -> None:
    run = run_routing()
    records = run.answer({"score": score})
    assert types(records) == [
        "action.completed",
        "transition.fired",
        "state.entered",
        "run.completed",
    ]
    fired = records[1]
    assert isinstance(fired, ev.TransitionFired)
    assert (fired.data.from_state, fired.data.to_state) == ("score", target)
    assert fired.data.transition == transition
    assert fired.data.event_type == "task.completed"
    assert run.state.state == target
    assert run.state.status == RunStatus.COMPLETED


def test_set_writes_context_with_typed_templates() -> None:
    run = run_routing()
    records = run.answer({"score": 9})
    fired = records[1]
    assert isinstance(fired, ev.TransitionFired)
    assert fired.data.set == {"band": "high", "twice": 18}
    assert run.state.context == {
        "seen": 0,
        "last_score": 9,
        "last_summary": None,
        "band": "high",
        "twice": 18,
    }
    assert run.state.outputs == {"band": "high"}


def test_action_output_mapping_writes_context() -> None:
    run = run_routing()
    records = run.answer({"score": 2, "summary": "too short", "extra": 1})
    completed = records[0]
    assert isinstance(completed, ev.ActionCompleted)
    assert completed.data.context_writes == {"last_score": 2, "last_summary": "too short"}
    assert completed.data.result == {"score": 2, "summary": "too short", "extra": 1}
    assert run.state.context["last_summary"] == "too short"
    assert run.state.states == {"score": {"output": completed.data.result}}


@pytest.mark.parametrize(
    ("guard_value", "why"),
    [("result.score", "guard gave int 9, not a boolean"), ("\"'yes'\"", "guard gave str 'yes'")],
)
def test_a_guard_giving_a_non_bool_does_not_fire_and_is_recorded(
    guard_value: str, why: str
) -> None:
    text = ROUTING.replace("guard: result.score > 7", f"guard: {guard_value}")
    run = Run(compile_one(text))
    run.start()
    records = run.answer({"score": 9})
    assert types(records) == [
        "action.completed",
        "guard.failed",
        "transition.fired",
        "state.entered",
        "run.completed",
    ]
    failed = records[1]
    assert isinstance(failed, ev.GuardFailed)
    assert failed.data.state == "score"
    assert failed.data.transition == 0
    assert failed.data.event_type == "task.completed"
    assert failed.data.guard == guard_value.strip('"')
    assert why in failed.data.error
    assert run.state.state == "mid"


def test_a_false_guard_is_not_a_failure() -> None:
    run = run_routing()
    assert "guard.failed" not in types(run.answer({"score": 1}))


def test_an_erroring_guard_records_guard_failed_naming_guard_and_error() -> None:
    run = run_routing()
    records = run.answer({"summary": "no score at all"})
    assert types(records)[:3] == ["action.completed", "guard.failed", "guard.failed"]
    first, second = records[1], records[2]
    assert isinstance(first, ev.GuardFailed)
    assert isinstance(second, ev.GuardFailed)
    assert (first.data.guard, first.data.transition) == ("result.score > 7", 0)
    assert (second.data.guard, second.data.transition) == ("result.score > 3", 1)
    assert "score" in first.data.error
    # fail-closed, and the unguarded transition after them still fires
    assert run.state.state == "low"


def test_a_guard_comparing_mismatched_types_fails_closed() -> None:
    run = run_routing()
    records = run.answer({"score": "9"})
    failed = records[1]
    assert isinstance(failed, ev.GuardFailed)
    assert "overload" in failed.data.error
    assert run.state.state == "low"


def test_a_custom_agent_event_type_routes() -> None:
    run = run_routing()
    records = run.answer({"by": "alice"}, type="review.approved")
    completed = records[0]
    assert isinstance(completed, ev.ActionCompleted)
    assert completed.data.event_type == "review.approved"
    fired = records[1]
    assert isinstance(fired, ev.TransitionFired)
    assert (fired.data.event_type, fired.data.to_state) == ("review.approved", "approved")
    assert run.state.outputs == {"by": "alice"}


def test_a_custom_event_type_without_transition_counts_as_completion() -> None:
    run = run_routing()
    records = run.answer({"score": 9}, type="review.commented")
    fired = records[1]
    assert isinstance(fired, ev.TransitionFired)
    assert (fired.data.event_type, fired.data.to_state) == ("task.completed", "high")


def test_task_failed_routes_with_the_error_as_result() -> None:
    run = run_routing()
    records = run.answer({"error": {"class": "timeout", "message": "too slow"}}, type="task.failed")
    assert types(records) == ["action.failed", "transition.fired", "state.entered", "run.completed"]
    failed = records[0]
    assert isinstance(failed, ev.ActionFailed)
    assert failed.data.error == ev.ErrorInfo(error_class="timeout", message="too slow")
    assert run.state.state == "low"
    assert run.state.pending == {}


def test_an_unrouted_failure_fails_the_run_with_its_class() -> None:
    run = run_routing()
    records = run.answer({"error": {"class": "schema_error", "message": "bad"}}, type="task.failed")
    assert types(records) == ["action.failed", "run.failed"]
    assert run.state.status == RunStatus.FAILED
    assert run.state.error == ev.ErrorInfo(error_class="schema_error", message="bad")


@pytest.mark.parametrize(
    ("data", "error_class"),
    [
        ("boom", "agent_error"),
        ({"error": {"class": "made_up"}}, "agent_error"),
        (None, "agent_error"),
    ],
)
def test_unknown_failures_are_agent_errors(data: object, error_class: str) -> None:
    run = run_routing()
    run.answer(data, type="task.failed")
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    assert run.state.error.error_class == error_class


def test_an_agents_own_failure_code_is_kept_and_readable_in_guards() -> None:
    run = run_routing()
    run.answer({"error": {"class": "tool_error", "message": "search down"}}, type="task.failed")
    assert run.state.error == ev.ErrorInfo(
        error_class="agent_error", message="search down", code="tool_error"
    )
    run = run_routing()
    coded = {"error": {"class": "agent_error", "message": "no", "code": "guardrail_denied"}}
    run.answer(coded, type="task.failed")
    assert run.state.error is not None
    assert run.state.error.code == "guardrail_denied"


CODED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: coded}
spec:
  initial_state: ask
  states:
    ask:
      actions: [{capability: search}]
      on:
        - {event: task.completed, goto: done}
        - {event: task.failed, guard: 'result.error.code == "tool_error"', goto: fallback}
      catch:
        - {errors: [agent_error], goto: handoff}
    done: {type: terminal}
    fallback: {type: terminal, outputs: {via: fallback}}
    handoff: {type: terminal, outputs: {via: handoff}}
"""


@pytest.mark.parametrize(
    ("error", "via"),
    [
        ({"class": "tool_error", "message": "down"}, "fallback"),
        ({"class": "agent_error", "message": "down", "code": "tool_error"}, "fallback"),
        ({"class": "agent_error", "message": "refused", "code": "guardrail_denied"}, "handoff"),
    ],
)
def test_a_failure_code_routes_before_catch_by_class(error: dict[str, str], via: str) -> None:
    run = Run(compile_one(CODED))
    run.start()
    run.answer({"error": error}, type="task.failed")
    assert run.state.outputs == {"via": via}


CATCH_CODES = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: catch-codes}
spec:
  initial_state: ask
  states:
    ask:
      actions: [{capability: search}]
      on:
        - {event: task.completed, goto: done}
      catch:
        - {codes: [tool_error, guardrail_denied], goto: fallback}
        - {errors: [agent_error], codes: [""], goto: handoff}
        - {errors: [timeout], goto: later}
    done: {type: terminal}
    fallback: {type: terminal, outputs: {via: fallback}}
    handoff: {type: terminal, outputs: {via: handoff}}
    later: {type: terminal, outputs: {via: later}}
"""


@pytest.mark.parametrize(
    ("error", "via"),
    [
        ({"class": "tool_error", "message": "down"}, "fallback"),
        ({"class": "agent_error", "message": "down", "code": "guardrail_denied"}, "fallback"),
        ({"class": "agent_error", "message": "plain"}, "handoff"),
        ({"class": "timeout", "message": "slow"}, "later"),
        ({"class": "agent_error", "message": "other", "code": "quota"}, None),
    ],
)
def test_catch_by_failure_code(error: dict[str, str], via: str | None) -> None:
    run = Run(compile_one(CATCH_CODES))
    run.start()
    run.answer({"error": error}, type="task.failed")
    if via is None:
        assert run.state.status == "failed"
        assert run.state.error is not None
        assert run.state.error.code == "quota"
    else:
        assert run.state.outputs == {"via": via}


SEQUENTIAL = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: sequential}
spec:
  inputs: {name: {type: string, default: world}}
  initial_state: work
  states:
    work:
      actions:
        - capability: fetch
          input: {url: "https://example.com/{{ inputs.name }}"}
          output: {body: body}
        - capability: summarize
          input: {text: "{{ context.body }}", size: "{{ size(context.body) }}"}
        - capability: echo
          input: {message: "$.states.work.output.summary"}
      on:
        - event: task.completed
          guard: result.message == "short"
          goto: done
    done:
      type: terminal
      outputs:
        literal: 42
        template: "{{ size(context.body) }}"
        text: "{{ inputs.name }} has {{ size(context.body) }} characters"
        reference: "$.states.work.output.message"
        missing_key: "$.states.work.output.nothing.here"
        nested: {list: ["{{ run.id }}", "$.states.work.output"], flag: true}
"""


def test_sequential_actions_and_task_completed_after_the_last() -> None:
    run = Run(compile_one(SEQUENTIAL), run_id="seq")
    first = run.start()
    assert types(first)[-1] == "action.requested"
    assert isinstance(first[-1], ev.ActionRequested)
    assert first[-1].data.input == {"url": "https://example.com/world"}
    second = run.answer({"body": "hello there"})
    assert types(second) == ["action.completed", "action.requested"]
    assert isinstance(second[1], ev.ActionRequested)
    assert second[1].data.index == 1
    assert second[1].data.input == {"text": "hello there", "size": 11}
    third = run.answer({"summary": "short"})
    assert types(third) == ["action.completed", "action.requested"]
    assert isinstance(third[1], ev.ActionRequested)
    assert third[1].data.input == {"message": "short"}
    last = run.answer({"message": "short"})
    assert types(last) == ["action.completed", "transition.fired", "state.entered", "run.completed"]
    assert run.state.result == {"message": "short"}


def test_terminal_outputs_literals_templates_and_references() -> None:
    run = Run(compile_one(SEQUENTIAL), run_id="seq")
    run.start({"name": "ada"})
    run.answer({"body": "0123456789"})
    run.answer({"summary": "short"})
    run.answer({"message": "short"})
    assert run.state.outputs == {
        "literal": 42,
        "template": 10,
        "text": "ada has 10 characters",
        "reference": "short",
        "missing_key": None,
        "nested": {"list": ["seq", {"message": "short"}], "flag": True},
    }


def test_no_transition_taking_task_completed_leaves_the_run_waiting() -> None:
    run = Run(compile_one(SEQUENTIAL))
    run.start()
    run.answer({"body": "x"})
    run.answer({"summary": "s"})
    records = run.answer({"message": "long"})
    assert types(records) == ["action.completed"]
    assert run.state.status == RunStatus.RUNNING
    assert run.state.pending == {}


LOOP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: loop}
spec:
  context: {fixes: 0}
  budget: {max_transitions: 1000}   # the review -> fix -> review loop is bounded by it
  initial_state: review
  states:
    review:
      actions: [{capability: review}]
      on:
        - {event: task.completed, guard: result.score > 7, goto: approval}
        - {event: task.completed, goto: fix}
    fix:
      actions: [{capability: echo, input: {message: fix}}]
      on:
        - {event: task.completed, goto: review, set: {fixes: "{{ context.fixes + 1 }}"}}
    approval:
      type: human_in_the_loop
      on:
        - event: approval.granted
          guard: data.approver != ""
          goto: done
          set: {approver: "{{ data.approver }}"}
        - {event: approval.denied, goto: done}
    done:
      type: terminal
      outputs: {approver: "{{ context.approver }}", score: "$.states.review.output.score"}
"""


def loop_run() -> Run:
    run = Run(compile_one(LOOP), run_id="loop")
    run.start()
    return run


def test_a_duplicate_answer_is_ignored() -> None:
    run = loop_run()
    action_id = run.pending_id()
    assert run.answer({"score": 2}, action_id=action_id, event_id="a")
    assert run.answer({"score": 2}, action_id=action_id, event_id="a") == []
    assert run.answer({"score": 9}, action_id=action_id, event_id="b") == []


def test_a_stale_answer_from_an_earlier_visit_is_ignored() -> None:
    run = loop_run()
    first_review = run.pending_id()
    run.answer({"score": 2})  # -> fix
    run.answer({"message": "fix"})  # -> review again, a new action id
    assert run.state.state == "review"
    assert run.pending_id() != first_review
    assert run.answer({"score": 9}, action_id=first_review) == []
    assert run.state.state == "review"
    assert run.state.context["fixes"] == 1


def test_an_answer_to_an_unknown_action_is_ignored() -> None:
    run = loop_run()
    assert run.answer({"score": 9}, action_id="loop:999") == []


def test_an_external_event_is_recorded_then_routes() -> None:
    run = loop_run()
    run.answer({"score": 9})
    assert run.state.state == "approval"
    records = run.send("approval.granted", {"approver": "alice"}, event_id="e-7")
    assert types(records) == [
        "event.received",
        "transition.fired",
        "state.entered",
        "run.completed",
    ]
    received = records[0]
    assert isinstance(received, ev.EventReceived)
    assert received.data.event == {
        "specversion": "1.0",
        "id": "e-7",
        "source": "https://example.com/test",
        "type": "approval.granted",
        "data": {"approver": "alice"},
    }
    assert run.state.outputs == {"approver": "alice", "score": 9}


def test_a_duplicate_external_event_is_ignored() -> None:
    run = loop_run()
    run.answer({"score": 9})
    first = run.send("approval.granted", {"approver": ""}, event_id="e-1")
    assert types(first) == ["event.received"]  # guard false: recorded, nothing fired
    assert run.send("approval.granted", {"approver": "bob"}, event_id="e-1") == []
    # the same id from another source is another event
    other = run.send("approval.granted", {"approver": "bob"}, source="urn:other", event_id="e-1")
    assert types(other)[0] == "event.received"
    assert run.state.state == "done"


def test_an_event_no_transition_waits_for_returns_nothing() -> None:
    run = loop_run()
    assert run.send("approval.granted", {"approver": "alice"}) == []  # still in review
    run.answer({"score": 9})
    assert run.send("something.else", {}) == []
    before = run.state
    assert run.send("approval.granted", {}, event_id="e-9") != []  # errors, but recorded
    assert run.state.seq > before.seq


def test_an_external_event_whose_guard_errors_records_guard_failed() -> None:
    run = loop_run()
    run.answer({"score": 9})
    records = run.send("approval.granted", {"who": "alice"})
    assert types(records) == ["event.received", "guard.failed"]
    failed = records[1]
    assert isinstance(failed, ev.GuardFailed)
    assert failed.data.guard == 'data.approver != ""'
    assert "approver" in failed.data.error
    assert run.state.state == "approval"


def test_a_finished_run_takes_nothing() -> None:
    run = loop_run()
    run.answer({"score": 9})
    run.send("approval.granted", {"approver": "alice"})
    assert run.state.status == RunStatus.COMPLETED
    assert run.send("approval.granted", {"approver": "x"}, event_id="late") == []
    assert run.cancel() == []


def test_cancel() -> None:
    run = loop_run()
    pending = run.pending_id()
    records = run.cancel("no longer needed")
    assert types(records) == ["run.cancelled"]
    cancelled = records[0]
    assert isinstance(cancelled, ev.RunCancelled)
    assert cancelled.data.reason == "no longer needed"
    assert cancelled.data.state == "review"
    assert cancelled.data.cancelled_actions == [pending]
    assert run.state.status == RunStatus.CANCELLED
    assert run.answer({"score": 9}, action_id=pending) == []
    assert run.cancel() == []


def test_deciding_is_pure_and_repeatable() -> None:
    run = loop_run()
    incoming = Incoming(
        type="task.completed",
        source="agent",
        id="x",
        data={"score": 2},
        extensions={"actionid": run.pending_id()},
    )
    state = run.state
    first = decide(run.definition, state, incoming, "2026-01-01T00:00:09Z")
    second = decide(run.definition, state, incoming, "2026-01-01T00:00:09Z")
    assert [ev.encode(r) for r in first] == [ev.encode(r) for r in second]
    assert run.state is state  # nothing changed in place
    assert all(r.time == "2026-01-01T00:00:09Z" for r in first)


def test_an_action_timeout_gives_a_deadline_from_now() -> None:
    text = LOOP.replace("[{capability: review}]", "[{capability: review, timeout: 1h30m}]")
    run = Run(compile_one(text), run_id="t")
    records = run.start()
    requested = next(r for r in records if isinstance(r, ev.ActionRequested))
    assert requested.data.timeout_s == 5400.0
    assert requested.data.deadline == "2026-01-01T01:30:01.000Z"
    assert run.state.pending[requested.data.action_id].deadline == requested.data.deadline


def test_a_failing_set_template_fails_the_run_as_expression_error() -> None:
    run = loop_run()
    run.answer({"score": 9})
    waiting = run.state
    records = run.send("approval.granted", {"approver": 7.5})
    # 7.5 != "" has no CEL overload: the guard fails closed, the run keeps waiting
    assert types(records) == ["event.received", "guard.failed"]
    assert run.state.status == RunStatus.RUNNING
    definition = compile_one(LOOP.replace('"{{ data.approver }}"', '"{{ data.approver.name }}"'))
    records = decide(
        definition,
        waiting,
        Incoming(type="approval.granted", source="s", id="i", data={"approver": "alice"}),
        "2026-01-01T00:01:00Z",
    )
    assert types(records) == ["event.received", "run.failed"]
    failed = records[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.error.error_class == "expression_error"
    assert "set 'approver'" in failed.data.error.message


def test_an_initial_terminal_state_completes_at_start() -> None:
    definition = compile_one(
        "apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: now}\n"
        "spec: {initial_state: done, states: {done: {type: terminal, outputs: "
        '{hello: "{{ inputs.who }}"}}}}\n'
    )
    run = Run(definition)
    assert types(run.start({"who": "world"})) == ["run.started", "state.entered", "run.completed"]
    assert run.state.outputs == {"hello": "world"}


def test_run_variables_are_readable_in_templates() -> None:
    definition = compile_one(
        "apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: vars, namespace: ops}\n"
        "spec: {initial_state: done, states: {done: {type: terminal, outputs: "
        '{run: "{{ run }}"}}}}\n'
    )
    run = Run(definition, run_id="r-vars")
    run.start(version=3)
    assert run.state.outputs == {
        "run": {
            "id": "r-vars",
            "workflow": "vars",
            "namespace": "ops",
            "version": 3,
            "started_at": "2026-01-01T00:00:01Z",
            "state": "done",
        }
    }


def test_an_answer_with_a_huge_integer_fails_the_guard_closed() -> None:
    run = run_routing()
    records = run.answer({"score": 2**64})
    assert types(records)[:2] == ["action.completed", "guard.failed"]


# --- terminal states that fail ------------------------------------------------------------

REJECTING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: rejecting}
spec:
  initial_state: review
  states:
    review:
      actions:
        - capability: review
      on:
        - event: task.completed
          guard: result.approved
          goto: merged
        - event: task.completed
          goto: rejected
          set: {by: "{{ result.by }}", score: "{{ result.score }}"}
    merged: {type: terminal, outputs: {merged: true}}
    rejected:
      type: terminal
      fail:
        message: "rejected by {{ context.by }}"
        %s
      outputs: {merged: false, score: "{{ context.score }}"}
"""


def test_a_terminal_state_with_fail_ends_the_run_failed_with_its_outputs() -> None:
    run = Run(compile_one(REJECTING % ""))
    run.start()
    records = run.answer({"approved": False, "by": "ada", "score": 3})
    assert types(records)[-2:] == ["state.entered", "run.failed"]
    failed = records[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.state == "rejected"
    assert failed.data.error == ev.ErrorInfo(
        error_class="workflow_failed", message="rejected by ada"
    )
    assert failed.data.outputs == {"merged": False, "score": 3}
    assert run.state.status == RunStatus.FAILED
    assert run.state.outputs == {"merged": False, "score": 3}
    assert run.state.error == failed.data.error


def test_a_failing_terminal_state_may_name_its_error_class() -> None:
    run = Run(compile_one(REJECTING % "class: agent_error"))
    run.start()
    run.answer({"approved": False, "by": "ada", "score": 3})
    assert run.state.error == ev.ErrorInfo(error_class="agent_error", message="rejected by ada")


def test_the_other_terminal_state_still_completes() -> None:
    run = Run(compile_one(REJECTING % ""))
    run.start()
    run.answer({"approved": True})
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"merged": True}


def test_a_fail_class_must_be_a_known_error_class() -> None:
    compiled = compile_sources([("test.yaml", REJECTING % "class: rejected")])
    [diag] = compiled.diagnostics
    assert (diag.rule, diag.line, diag.col) == ("unknown-error-class", 22, 16)
    assert "unknown error class 'rejected'" in diag.message


# --- a deadline for the whole run -----------------------------------------------------------

DEADLINED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: deadlined}
spec:
  deadline: {after: 1h, %s}
  initial_state: build
  states:
    build:
      actions: [{capability: build}]
      on: [{event: task.completed, goto: approve}]
    approve:
      type: human_in_the_loop
      timeout: {after: 30m, goto: approve}
      on: [{event: approved, goto: done}]
    done: {type: terminal, outputs: {ok: true}}
    late:
      type: terminal
      fail: {message: "{{ context.reason }}"}
"""


def test_the_deadline_is_scheduled_at_start_and_outlives_state_changes() -> None:
    run = Run(compile_one(DEADLINED % "goto: late, set: {reason: too slow}"))
    records = run.start()
    assert types(records) == [
        "run.started",
        "timer.scheduled",
        "state.entered",
        "action.requested",
    ]
    deadline = records[1]
    assert isinstance(deadline, ev.TimerScheduled)
    assert (deadline.data.purpose, deadline.data.fire_at) == (
        "run-deadline",
        "2026-01-01T01:00:01.000Z",
    )
    run.answer({})
    assert run.state.state == "approve"
    assert [t.purpose for t in run.state.timers.values()] == ["run-deadline", "state-timeout"]
    run.fire("state-timeout")  # the state's own timeout re-enters it; the deadline stays
    assert [t.purpose for t in run.state.timers.values()] == ["run-deadline", "state-timeout"]

    records = run.fire("run-deadline")
    assert types(records) == [
        "timer.fired",
        "transition.fired",
        "state.entered",
        "run.failed",
    ]
    moved = records[1]
    assert isinstance(moved, ev.TransitionFired)
    assert (moved.data.from_state, moved.data.to_state, moved.data.event_type) == (
        "approve",
        "late",
        "run.deadline",
    )
    assert run.state.status == RunStatus.FAILED
    assert run.state.error == ev.ErrorInfo(error_class="workflow_failed", message="too slow")


def test_without_goto_the_deadline_fails_the_run_with_timeout_and_cancels_work() -> None:
    late = DEADLINED.index("    late:")
    run = Run(compile_one(DEADLINED[:late] % "goto: null"))
    run.start()
    records = run.fire("run-deadline")
    assert types(records) == ["timer.fired", "action.cancelled", "run.failed"]
    assert run.state.error == ev.ErrorInfo(
        error_class="timeout", message="the run did not finish within 3600s"
    )


def test_a_run_that_ends_first_leaves_its_deadline_stale() -> None:
    run = Run(compile_one(DEADLINED % "goto: late, set: {reason: too slow}"))
    run.start()
    [deadline_id] = [t for t, v in run.state.timers.items() if v.purpose == "run-deadline"]
    run.answer({})
    run.send("approved")
    assert run.state.status == RunStatus.COMPLETED
    assert run.fire("run-deadline", deadline_id) == []


def test_a_deadline_goto_must_name_a_state_and_makes_it_reachable() -> None:
    compiled = compile_sources([("test.yaml", DEADLINED % "goto: nowhere")])
    rules = [(d.rule, d.line) for d in compiled.diagnostics]
    # `late` is reachable only through the deadline: nowhere does not make it so.
    assert ("unknown-goto", 5) in rules
    assert ("unreachable-state", 16) in rules
    assert compile_one(DEADLINED % "goto: late").deadline is not None


def test_who_answered_is_recorded_with_the_answer() -> None:
    run = run_routing()
    [completed] = [r for r in run.answer({"score": 9}) if isinstance(r, ev.ActionCompleted)]
    assert completed.data.source == "interlock://agent/test"
    run = run_routing()
    failed = run.answer({"error": {"class": "timeout", "message": "x"}}, type="task.failed")
    assert isinstance(failed[0], ev.ActionFailed)
    assert failed[0].data.source == "interlock://agent/test"
