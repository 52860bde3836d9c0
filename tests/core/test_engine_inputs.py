"""An evidence event is kept in any state, and a state that waits for its type still takes
it: its guard and its ``set`` read the event (``data``, ``event``) like any other's."""

from __future__ import annotations

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.engine import GuardCheck, start
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

WAITING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: waits-for-evidence}
spec:
  evidence: {events: [release.evidence]}
  initial_state: build
  states:
    build:
      actions: [{capability: ci.build}]
      on: [{event: task.completed, goto: waiting}]
    waiting:
      type: human_in_the_loop
      on:
        - event: release.evidence
          guard: data.release.receipt == "verified"
          goto: done
          set: {receipt: "{{ data.release.receipt }}", by: "{{ event.source }}"}
    done:
      type: terminal
      outputs: {receipt: "{{ context.receipt }}", by: "{{ context.by }}"}
"""


def test_a_state_waiting_for_an_evidence_event_takes_it_reading_its_data() -> None:
    run = Run(compile_one(WAITING), run_id="ev")
    run.start()
    # Before the state waits for it, the evidence is kept and nothing moves.
    early = run.send("release.evidence", {"release": {"receipt": "pending"}}, event_id="e1")
    assert types(early) == ["evidence.recorded"]
    run.answer({})
    assert run.state.state == "waiting"
    # A guard that reads the event's data and gives false: recorded, the state waits on.
    refused = run.send("release.evidence", {"release": {"receipt": "forged"}}, event_id="e2")
    assert types(refused) == ["evidence.recorded"]
    assert run.state.state == "waiting"
    taken = run.send(
        "release.evidence",
        {"release": {"receipt": "verified"}},
        source="urn:notary",
        event_id="e3",
    )
    assert types(taken) == [
        "evidence.recorded",
        "transition.fired",
        "state.entered",
        "run.completed",
    ]
    fired = taken[1]
    assert isinstance(fired, ev.TransitionFired)
    assert (fired.data.from_state, fired.data.to_state) == ("waiting", "done")
    assert (fired.data.event_type, fired.data.event_id) == ("release.evidence", "e3")
    assert fired.data.set == {"receipt": "verified", "by": "urn:notary"}
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"receipt": "verified", "by": "urn:notary"}
    assert run.state.evidence == {"release": {"receipt": "verified"}}


CHECKPOINT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: checkpoint}
spec:
  initial_state: implement
  states:
    implement:
      actions: [{capability: coder}]
      gate:
        requires: {diff: true}
        evidence: ['"evidence" in result ? result.evidence : {}']
      on:
        - {event: task.completed, goto: done}
        - {event: work.abandoned, goto: abandoned, set: {by: "{{ data.by }}"}}
    done: {type: terminal}
    abandoned: {type: terminal, fail: {message: "abandoned by {{ context.by }}"}}
"""


def test_a_gate_on_a_state_with_actions_checks_answers_not_events_from_outside() -> None:
    run = Run(compile_one(CHECKPOINT), run_id="cp")
    run.start()
    coder = run.pending_id()
    records = run.send("work.abandoned", {"by": "alice"}, event_id="stop")
    assert types(records) == [
        "event.received",
        "action.cancelled",
        "transition.fired",
        "state.entered",
        "run.failed",
    ]
    cancelled = records[1]
    assert isinstance(cancelled, ev.ActionCancelled)
    assert cancelled.data.action_id == coder
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    assert run.state.error.message == "abandoned by alice"


FAN = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: fan}
spec:
  inputs: {items: {type: list}}
  initial_state: fan
  states:
    fan:
      map:
        over: inputs.items
        as: item
        action: {capability: work}
      on:
        - {event: task.completed, guard: size(result) == 0, goto: nothing}
        - {event: task.completed, goto: done}
    nothing: {type: terminal}
    done: {type: terminal}
"""


def test_starting_a_run_reports_the_guards_its_first_state_weighs() -> None:
    # A map over no items is done as it starts: its `on` entries are weighed then.
    definition = compile_one(FAN)
    trace: list[GuardCheck] = []
    records = start(
        definition, run_id="f", inputs={"items": []}, now="2026-01-01T00:00:00Z", trace=trace
    )
    assert types(records)[-2:] == ["state.entered", "run.completed"]
    assert trace == [
        GuardCheck(
            state="fan",
            event_type="task.completed",
            transition=0,
            goto="nothing",
            guard="size(result) == 0",
            outcome="fired",
            value=True,
            reads={"result": []},
        )
    ]


def test_explain_shows_the_guards_a_start_weighed() -> None:
    # `interlock explain` re-drives the start: its step lists the entry the empty map
    # fired, with the value its guard read, and says which entry moved the run.
    definition = compile_one(FAN)
    records = start(definition, run_id="f", inputs={"items": []}, now="2026-01-01T00:00:00Z")
    why = analysis.explain(records, definition)
    assert why["reproduces"] is True
    [first] = why["steps"]
    assert [(c["guard"], c["outcome"], c["value"]) for c in first["checks"]] == [
        ("size(result) == 0", "fired", True)
    ]
    assert first["fired"]["to"] == "nothing"
