"""Pausing one run in the core: it takes no transition while paused, the events it would
take are held in its log and decided on, in order, when it is resumed; nothing is held
twice; it folds and replays the same; a paused queued run is not admitted."""

from __future__ import annotations

import pytest

from interlock.core import events as ev
from interlock.core import runpause
from interlock.core.engine import resume
from interlock.core.limits import admitted
from interlock.core.runpause import pause
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

TWO_STEPS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: twosteps}
spec:
  initial_state: first
  states:
    first:
      actions: [{capability: echo}]
      on:
        - {event: task.completed, goto: wait}
    wait:
      on:
        - {event: com.example.go, goto: second}
    second:
      actions: [{capability: echo}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def paused_run() -> Run:
    run = Run(compile_one(TWO_STEPS), run_id="r1")
    run.start()
    run._apply(pause(run.state, reason="vendor down", now=run.now()))
    return run


def test_a_paused_run_holds_what_it_would_take_and_decides_on_it_when_resumed() -> None:
    run = paused_run()
    assert run.state.paused is not None
    assert run.state.paused.reason == "vendor down"
    action = run.pending_id()
    held = run.answer({"ok": 1}, event_id="a-1")
    assert types(held) == ["event.held"]
    assert run.state.state == "first"  # no transition while paused
    assert run.answer({"ok": 1}, action_id=action, event_id="a-1") == []  # redelivered
    # An event the run would not take is not held.
    assert run.send("com.example.unknown") == []
    assert run.send("com.example.go", event_id="go-1") != []  # (taken in 'wait' only)
    records = resume(run.definition, run.state, run.now())
    run._apply(records)
    assert types(records)[:4] == [
        "run.resumed",
        "action.completed",
        "transition.fired",
        "state.entered",
    ]
    assert run.state.paused is None
    assert run.state.state == "second"  # the held go event was decided on after the answer
    assert resume(run.definition, run.state, run.now()) == []  # not paused: nothing
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_pausing_twice_or_an_ended_run_records_nothing_and_cancel_still_works() -> None:
    run = paused_run()
    assert pause(run.state, reason="again", now=run.now()) == []
    assert types(run.cancel()) == ["run.cancelled"]
    assert run.state.status == RunStatus.CANCELLED
    assert pause(run.state, reason="late", now=run.now()) == []
    assert resume(run.definition, run.state, run.now()) == []


def test_a_paused_queued_run_is_admitted_only_once_resumed() -> None:
    limited = TWO_STEPS.replace("spec:\n", "spec:\n  concurrency: [{key: '\"all\"', limit: 1}]\n")
    run = Run(compile_one(limited), run_id="r2")
    run.start()
    assert run.state.queued
    run._apply(pause(run.state, reason="", now=run.now(), workflow=True))
    assert admitted(run.definition, run.state, run.now()) == []
    records = resume(run.definition, run.state, run.now())
    assert types(records) == ["run.resumed"]
    run._apply(records)
    assert types(admitted(run.definition, run.state, run.now()))[:2] == [
        "run.admitted",
        "state.entered",
    ]


def test_the_pause_records_say_what_they_are() -> None:
    run = paused_run()
    paused = run.log[-1]
    assert isinstance(paused, ev.RunPaused)
    assert ev.record_type(paused) == "io.interlock.run.paused"
    assert ev.decode(ev.encode(paused)) == paused


def test_a_paused_run_holds_at_most_so_many_events(monkeypatch: pytest.MonkeyPatch) -> None:
    looping = TWO_STEPS.replace(
        "        - {event: com.example.go, goto: second}",
        "        - {event: com.example.go, goto: wait}\n"
        "        - {event: com.example.end, goto: second}",
    )
    run = Run(compile_one(looping), run_id="r3")
    run.start()
    run.answer({"ok": 1})
    assert run.state.state == "wait"
    run._apply(pause(run.state, reason="", now=run.now()))
    monkeypatch.setattr(runpause, "MAX_HELD", 3)
    held = [run.send("com.example.go", event_id=f"go-{n}") for n in range(5)]
    assert [types(h) for h in held] == [["event.held"]] * 3 + [[], []]


def test_logs_say_what_the_pause_records_are() -> None:
    from interlock.core.record_text import summarize

    run = paused_run()
    run.answer({"ok": 1})
    run._apply(resume(run.definition, run.state, run.now()))
    lines = [
        summarize(r)
        for r in run.log
        if "paused" in ev.record_type(r)
        or "held" in ev.record_type(r)
        or "resumed" in ev.record_type(r)
    ]
    assert lines == [
        "run.paused: vendor down",
        "event.held task.completed id=answer-1 (decided on when resumed)",
        "run.resumed, 1 held event(s) decided on",
    ]


LATE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: bounded}
spec:
  deadline: {after: 60s, goto: late}
  initial_state: work
  states:
    work:
      actions: [{capability: echo}]
      on:
        - {event: task.completed, goto: wait}
    wait:
      on:
        - {event: com.example.go, goto: done}
    late: {type: terminal}
    done: {type: terminal}
"""


def test_a_paused_runs_deadline_keeps_counting_and_is_decided_on_when_resumed() -> None:
    """Time does not stop for a paused run: its deadline comes due while it is paused, is
    held like any event, and is decided on at the resume after what was held before it
    (the answer moves the run on, then the deadline takes it to its goto)."""
    run = Run(compile_one(LATE), run_id="r1")
    run.start()
    run._apply(pause(run.state, reason="vendor down", now=run.now()))
    assert types(run.answer({"ok": 1})) == ["event.held"]
    assert types(run.fire("run-deadline")) == ["event.held"]
    assert run.state.status == RunStatus.RUNNING
    assert run.state.state == "work"
    records = run._apply(resume(run.definition, run.state, run.now()))
    entered = [r.data.state for r in records if isinstance(r, ev.StateEntered)]
    assert entered == ["wait", "late"]
    assert run.state.status == RunStatus.COMPLETED
    assert encode_state(fold(run.log)) == encode_state(run.state)
