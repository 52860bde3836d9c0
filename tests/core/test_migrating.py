"""A run migrated across a change of its workflow's concurrency limits: it gives back the
slots its new version does not ask for and asks for those it adds, holding in its state
what reaches it until it is admitted; its log replays against the version it ended on."""

from __future__ import annotations

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.engine import Incoming, admit, resume
from interlock.core.limits import admitted
from interlock.core.runpause import pause
from support.core import Run, compile_one, types

PLAIN = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: orders}
spec:
  inputs: {customer: {type: string, required: true}}
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""

LIMITED = PLAIN.replace(
    "  initial_state:", "  concurrency:\n    - {key: inputs.customer, limit: 1}\n  initial_state:"
)


def plain() -> Definition:
    return compile_one(PLAIN)


def limited(text: str = LIMITED) -> Definition:
    return compile_one(text)


def migrate(run: Run, definition: Definition, version: int) -> list[ev.AnyRecord]:
    made, report = analysis.migration(run.log, definition, version=version, now=run.now())
    assert report["migrate"] is None, report["migrate"]
    run.definition = definition
    return run._apply(made)


def go(run: Run, n: int = 1) -> Incoming:
    return Incoming(type="go", source="test", id=f"go-{n}", time=run.now())


def test_a_run_moved_onto_a_limit_waits_in_its_state_holding_what_reaches_it() -> None:
    run = Run(plain())
    run.start({"customer": "acme"})
    made = migrate(run, limited(), 2)
    assert types(made) == ["run.migrated", "run.queued"]
    queued = made[1]
    assert isinstance(queued, ev.RunQueued)
    assert queued.data.holds is True
    assert [(c.limit, c.key, c.size) for c in queued.data.slots] == [
        ("default/orders#1", "acme", 1)
    ]
    assert run.state.queued
    assert run.state.state == "wait"
    # Not admitted: the signal is held, not taken.
    assert types(run.deliver(go(run))) == ["event.held"]
    assert run.state.status == "running"
    assert run.deliver(go(run)) == []  # a redelivery is held once
    explained = analysis.explain(run.log, run.definition)
    assert explained["waiting"]["held_until"] == "admitted"
    assert explained["steps"][-1]["why_none"] == (
        "held: the run waits for its slots (decided on when it is admitted)"
    )
    # Admitted: the held signal is decided on after run.admitted, in the same batch.
    decided = run._apply(admit(run.definition, run.state, run.now()))
    assert types(decided)[:2] == ["run.admitted", "event.received"]
    assert run.state.status == "completed"
    assert run.state.slots is not None  # the end record frees them
    # The log replays against the version it ended on, and against the one it left.
    assert analysis.replay(run.log, limited(), version=2)["agree"] is True
    assert analysis.explain(run.log, limited())["reproduces"] is True


def test_a_fork_of_a_run_waiting_for_its_slots_takes_its_own_and_enters_its_state() -> None:
    run = Run(plain())
    run.start({"customer": "acme"})
    migrate(run, limited(), 2)
    run.deliver(go(run))
    assert run.state.waits is not None
    forked = analysis.fork(
        run.log, len(run.log), run_id="r-fork", definition=limited(), version=2, now=run.now()
    )
    fork = Run(limited(), run_id="r-fork")
    fork._apply(forked)
    assert types(forked)[-2:] == ["run.forked", "run.queued"]
    assert fork.state.waits is None
    assert fork.state.queued
    assert types(admit(fork.definition, fork.state, fork.now())) == [
        "run.admitted",
        "state.entered",
    ]


def test_admitted_alone_records_nothing_for_the_held_events() -> None:
    run = Run(plain())
    run.start({"customer": "acme"})
    migrate(run, limited(), 2)
    run.deliver(go(run))
    assert types(admitted(run.definition, run.state, run.now())) == ["run.admitted"]


def test_a_run_moved_off_its_limit_frees_its_slot_and_goes_on() -> None:
    run = Run(limited())
    run.start({"customer": "acme"})
    run._apply(admit(run.definition, run.state, run.now()))
    assert run.state.state == "wait"
    made = migrate(run, plain(), 2)
    assert types(made) == ["run.migrated"]
    moved = made[0]
    assert isinstance(moved, ev.RunMigrated)
    assert [(c.limit, c.key) for c in moved.data.freed] == [("default/orders#1", "acme")]
    assert run.state.slots is None
    assert not run.state.queued
    assert types(run.deliver(go(run)))[-1] == "run.completed"


def test_a_run_waiting_in_line_moved_off_its_limit_is_admitted_into_its_first_state() -> None:
    run = Run(limited())
    run.start({"customer": "acme"})
    assert run.state.queued
    assert not run.state.state
    made = migrate(run, plain(), 2)
    assert types(made) == ["run.migrated", "run.queued"]
    assert isinstance(made[1], ev.RunQueued)
    assert made[1].data.slots == []
    assert made[1].data.holds is False
    assert types(admit(run.definition, run.state, run.now())) == [
        "run.admitted",
        "state.entered",
    ]


def test_the_same_limit_on_both_versions_keeps_its_slot() -> None:
    run = Run(limited())
    run.start({"customer": "acme"})
    run._apply(admit(run.definition, run.state, run.now()))
    again = limited(LIMITED.replace("on: [{event: go", "on: [{event: go2, goto: done}, {event: go"))
    made = migrate(run, again, 2)
    assert types(made) == ["run.migrated"]
    assert isinstance(made[0], ev.RunMigrated)
    assert made[0].data.freed == []
    assert run.state.slots is not None
    assert not run.state.queued


def test_a_move_whose_keys_cannot_be_computed_is_refused_with_the_reason() -> None:
    run = Run(plain())
    run.start({"customer": "acme"})
    broken = limited(LIMITED.replace("key: inputs.customer", "key: inputs.customer.name"))
    made, report = analysis.migration(run.log, broken, version=2, now=run.now())
    assert made == []
    assert report["migrate"].startswith("on the new version, the key of concurrency limit")


def test_a_paused_waiting_run_is_admitted_only_once_resumed() -> None:
    run = Run(plain())
    run.start({"customer": "acme"})
    migrate(run, limited(), 2)
    run._apply(pause(run.state, reason="look", now=run.now()))
    assert types(run.deliver(go(run))) == ["event.held"]
    assert admitted(run.definition, run.state, run.now()) == []  # paused: not admitted
    resumed = run._apply(resume(run.definition, run.state, run.now()))
    assert types(resumed) == ["run.resumed", "event.held"]  # still waits for its slot
    assert run.state.paused is None
    assert run.state.waits is not None
    run._apply(admit(run.definition, run.state, run.now()))
    assert run.state.status == "completed"
    assert analysis.replay(run.log, limited(), version=2)["agree"] is True
