"""A state's evidence gate: the answer that completes a state's actions must prove what
the gate requires (from the evidence the answer carries, merged over what evidence events
have proven for the subject) before the state passes; an answer that does not is refused
(``gate.checked``, not proven) and the action is asked again at the same attempt."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

GATED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: gated}
spec:
  evidence: {events: [build.evidence]}
  context: {earlier: {}}
  initial_state: build
  states:
    build:
      actions:
        - {capability: ci.build, retry: {max_attempts: 3, backoff: {initial: 1s, jitter: false}}}
      gate:
        requires: {diff: true, tests: green}
        evidence: ['"evidence" in result ? result.evidence : {}', context.earlier]
        when: result.status == "passed"
      on:
        - {event: task.completed, guard: 'result.status == "passed"', goto: done}
        - {event: task.completed, goto: failed}
    done: {type: terminal}
    failed: {type: terminal}
"""


def _run(text: str = GATED) -> Run:
    """A run of the workflow ``text``, started."""
    run = Run(compile_one(text))
    run.start()
    return run


def test_an_answer_that_proves_the_gate_passes_the_state() -> None:
    run = _run()
    first = run.pending_id()
    records = run.answer({"status": "passed", "evidence": {"diff": "+x", "tests": "green"}})
    assert types(records) == [
        "action.completed", "gate.checked", "transition.fired", "state.entered", "run.completed",
    ]  # fmt: skip
    checked = records[1]
    assert isinstance(checked, ev.GateChecked)
    assert checked.data.proven
    assert checked.data.action_id == first
    assert checked.data.subject == "build"
    assert checked.data.step == ""
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.state == "done"


def test_a_refused_answer_asks_again_without_costing_an_attempt() -> None:
    run = _run()
    first = run.pending_id()
    records = run.answer({"status": "passed", "evidence": {"diff": "+x", "tests": "red"}})
    assert types(records) == ["action.completed", "gate.checked", "action.requested"]
    checked, again = records[1], records[2]
    assert isinstance(checked, ev.GateChecked)
    assert not checked.data.proven
    assert checked.data.missing == ["tests"]
    assert checked.data.action_id == first
    assert isinstance(again, ev.ActionRequested)
    assert again.data.attempt == 1
    assert again.data.action_id != first
    assert run.state.state == "build"
    # Still every retry left: a failure now is the first of three attempts.
    records = run.answer({"error": {"class": "timeout"}}, type="task.failed")
    failed = records[0]
    assert isinstance(failed, ev.ActionFailed)
    assert failed.data.attempt == 1
    assert failed.data.will_retry
    assert encode_state(fold(run.log)) == encode_state(run.state)


@pytest.mark.parametrize("empty", [None, "", False, [], {}])
def test_a_requirement_of_true_is_not_proven_by_an_empty_value(empty: Any) -> None:
    run = _run()
    records = run.answer({"status": "passed", "evidence": {"diff": empty, "tests": "green"}})
    checked = records[1]
    assert isinstance(checked, ev.GateChecked)
    assert checked.data.missing == ["diff"]
    assert run.state.state == "build"


@pytest.mark.parametrize("shown", ["+x", 0, True, ["a.py"], {"a.py": 1}])
def test_a_requirement_of_true_is_proven_by_any_other_value(shown: Any) -> None:
    run = _run()
    run.answer({"status": "passed", "evidence": {"diff": shown, "tests": "green"}})
    assert run.state.state == "done"


def test_answers_the_gate_does_not_apply_to_route_as_they_are() -> None:
    run = _run()
    records = run.answer({"status": "failed"})
    assert "gate.checked" not in types(records)
    assert run.state.state == "failed"


def test_recorded_evidence_counts_and_the_answer_overrides_it() -> None:
    run = _run()
    run.send("build.evidence", {"build": {"tests": "green", "diff": "old"}}, event_id="e1")
    records = run.answer({"status": "passed", "evidence": {"diff": "+x"}})
    assert "gate.checked" in types(records)
    assert run.state.state == "done"


def test_evidence_that_errors_or_is_not_a_map_proves_nothing() -> None:
    run = _run()
    # An answer without evidence: the first expression gives {}, context.earlier {}.
    records = run.answer({"status": "passed"})
    checked = records[1]
    assert isinstance(checked, ev.GateChecked)
    assert checked.data.missing == ["diff", "tests"]
    records = run.answer({"status": "passed", "evidence": "not a map"})
    assert not records[1].data.proven  # type: ignore[union-attr]
    assert run.state.state == "build"


def test_a_when_that_errors_checks_the_gate_fail_closed() -> None:
    run = _run()
    records = run.answer({"evidence": {"diff": "+x"}})  # no status: `when` errors
    assert types(records)[:3] == ["action.completed", "guard.failed", "gate.checked"]
    assert types(records)[-1] == "action.requested"


def test_refusals_are_bounded_by_the_action_budget() -> None:
    definition = compile_one(
        GATED.replace("  initial_state", "  budget: {max_actions: 3}\n  initial_state")
    )
    run = Run(definition)
    run.start()
    for _ in range(3):
        run.answer({"status": "passed"})
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    assert run.state.error.error_class == "budget_exceeded"


def _rules(text: str) -> list[str]:
    return [d.rule for d in compile_sources([("g.yaml", text)]).diagnostics]


def test_a_gate_needs_actions() -> None:
    start = GATED.index("      actions:")
    end = GATED.index("      gate:")
    text = GATED[:start] + "      type: human_in_the_loop\n" + GATED[end:]
    assert _rules(text) == ["gate-placement"]


def test_a_gate_that_reads_no_evidence_is_refused() -> None:
    text = GATED.replace("  evidence: {events: [build.evidence]}\n", "").replace(
        "        evidence: ['\"evidence\" in result ? result.evidence : {}', context.earlier]\n", ""
    )
    assert _rules(text) == ["gate-without-evidence"]
    # Evidence from the answers alone is enough.
    assert _rules(GATED.replace("  evidence: {events: [build.evidence]}\n", "")) == []


def test_a_gate_expression_that_does_not_compile_is_refused() -> None:
    assert _rules(GATED.replace("when: result.status", "when: result.status ==")) == ["cel-compile"]


WAITING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: release}
spec:
  initial_state: approval
  states:
    approval:
      type: human_in_the_loop
      gate:
        requires: {ticket: true, risk: low}
        evidence: ['"evidence" in data ? data.evidence : {}']
        when: data.decision == "approve"
      on:
        - {event: release.decided, guard: data.decision == "approve", goto: shipped}
        - {event: release.decided, goto: held}
    shipped: {type: terminal}
    held: {type: terminal}
"""


def test_a_gate_on_a_waiting_state_refuses_the_event_and_the_state_waits_on() -> None:
    run = _run(WAITING)
    refused = run.send(
        "release.decided", {"decision": "approve", "evidence": {"risk": "high"}}, event_id="e-1"
    )
    assert types(refused) == ["event.received", "gate.checked"]
    checked = refused[-1]
    assert isinstance(checked, ev.GateChecked)
    assert (checked.data.proven, checked.data.missing) == (False, ["ticket", "risk"])
    assert run.state.state == "approval"
    taken = run.send(
        "release.decided",
        {"decision": "approve", "evidence": {"ticket": "T-9", "risk": "low"}},
        event_id="e-2",
    )
    assert types(taken)[:2] == ["event.received", "gate.checked"]
    assert run.state.state == "shipped"
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_a_waiting_states_gate_checks_only_what_when_selects() -> None:
    run = _run(WAITING)
    out = run.send("release.decided", {"decision": "hold"}, event_id="e-1")
    assert types(out) == ["event.received", "transition.fired", "state.entered", "run.completed"]
    assert run.state.state == "held"


def test_gate_expressions_that_error_are_recorded_and_the_rest_still_prove() -> None:
    text = GATED.replace(
        """evidence: ['"evidence" in result ? result.evidence : {}', context.earlier]""",
        "evidence: [result.evidence.extra, data.evidence]",
    )
    run = _run(text)
    first = run.pending_id()
    # The first expression errors (no `extra`): it proves nothing, and the next one still
    # counts, reading the answer as `data`.
    records = run.answer({"status": "passed", "evidence": {"tests": "green", "diff": "+x"}})
    assert types(records)[:3] == ["action.completed", "guard.failed", "gate.checked"]
    failed, checked = records[1], records[2]
    assert isinstance(failed, ev.GuardFailed)
    assert failed.data == ev.GuardFailedData(
        state="build",
        transition=-1,
        event_type="gate.evidence",
        guard="result.evidence.extra",
        error="no such member in mapping: 'extra'",
    )
    assert isinstance(checked, ev.GateChecked)
    assert checked.data == ev.GateCheckedData(
        state="build", subject="build", proven=True, missing=[], action_id=first
    )
    assert run.state.state == "done"


def test_a_when_that_errors_is_recorded_with_its_expression_and_error() -> None:
    run = _run()
    records = run.answer({"evidence": {"diff": "+x"}})  # no status: `when` errors
    failed = records[1]
    assert isinstance(failed, ev.GuardFailed)
    assert failed.data == ev.GuardFailedData(
        state="build",
        transition=-1,
        event_type="gate.when",
        guard='result.status == "passed"',
        error="no such member in mapping: 'status'",
    )


def test_a_refusal_after_a_retry_asks_again_at_the_same_attempt() -> None:
    run = _run()
    run.answer({"error": {"class": "timeout"}}, type="task.failed")
    run.fire("retry")
    [pending] = run.state.pending.values()
    assert pending.attempt == 2
    records = run.answer({"status": "passed", "evidence": {"diff": "+x"}})
    again = records[-1]
    assert isinstance(again, ev.ActionRequested)
    assert again.data.attempt == 2
    assert again.data.retry == pending.retry


def test_a_waiting_states_gate_record_names_the_state_and_no_action() -> None:
    run = _run(WAITING)
    refused = run.send("release.decided", {"decision": "approve"}, event_id="e-1")
    checked = refused[-1]
    assert isinstance(checked, ev.GateChecked)
    assert checked.data == ev.GateCheckedData(
        state="approval",
        subject="approval",
        proven=False,
        missing=["ticket", "risk"],
        action_id="",
    )


def test_evidence_whose_map_holds_an_error_proves_nothing() -> None:
    # CEL builds the map with the error as a value; the gate must not take it as proof.
    text = GATED.replace(
        """evidence: ['"evidence" in result ? result.evidence : {}', context.earlier]""",
        """evidence: ['{"diff": result.nope, "tests": "green"}', '[result.nope]']""",
    )
    run = _run(text)
    records = run.answer({"status": "passed"})
    assert types(records) == [
        "action.completed", "guard.failed", "guard.failed", "gate.checked", "action.requested",
    ]  # fmt: skip
    errors = [r.data.error for r in records if isinstance(r, ev.GuardFailed)]
    assert errors == ["no such member in mapping: 'nope'"] * 2
    checked = records[3]
    assert isinstance(checked, ev.GateChecked)
    assert (checked.data.proven, checked.data.missing) == (False, ["diff", "tests"])
    assert run.state.state == "build"
