"""Continue-as-new in the engine: a transition's ``continue_as_new``, the history limits of
``spec.history`` (auto continues near one, ``never`` fails at it), what a continued run
takes over, and that each link of a chain replays from its own log alone."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.continuing import continued_run_id
from interlock.core.engine import continuation
from interlock.core.history import DEFAULT, limits, parse_size
from interlock.core.redrive import redrive
from interlock.core.replay import replay
from interlock.core.state import fold
from support.core import Run, compile_one, types

TICKING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: ticking}
spec:
  inputs:
    order: {type: string, required: true}
    round: {type: integer, default: 1}
  correlate:
    key: "{{ inputs.order }}"
    events: {tick: data.order}
  budget: {max_transitions: 60}
  deadline: {after: 1h}
  HISTORY
  initial_state: waiting
  states:
    waiting:
      on:
        - event: renew
          goto: waiting
          set: {last: "{{ data.n }}"}
          continue_as_new: {inputs: {round: "{{ inputs.round + 1 }}"}}
        - event: tick
          goto: waiting
          set: {ticks: "{{ (has(context.ticks) ? context.ticks : 0) + 1 }}"}
        - {event: finish, goto: done}
    done:
      type: terminal
      outputs: {round: "{{ inputs.round }}", ticks: "{{ context.ticks }}"}
"""


def ticking(history: str = "") -> Run:
    run = Run(compile_one(TICKING.replace("HISTORY", history)), run_id="r-first")
    run.start({"order": "o-1"})
    return run


def follow(run: Run) -> Run:
    """The run that continues ``run``, started as the shell starts it."""
    last = run.log[-1]
    assert isinstance(last, ev.RunContinued)
    records, state = continuation(run.definition, run.state, last)
    nxt = Run(run.definition, run_id=last.data.run_id)
    nxt.tick = run.tick
    nxt._apply(records)
    assert nxt.state == state
    return nxt


def test_a_continue_as_new_transition_ends_the_log_and_names_the_next_run() -> None:
    run = ticking()
    run.send("tick", {"order": "o-1"}, event_id="t1")
    records = run.send("renew", {"n": 7}, event_id="r1")
    assert types(records) == ["event.received", "transition.fired", "run.continued"]
    continued = records[-1]
    assert isinstance(continued, ev.RunContinued)
    d = continued.data
    assert d.run_id == continued_run_id("r-first", run.state.seq) != "r-first"
    assert (d.state, d.reason, d.records) == ("waiting", "transition", run.state.seq)
    assert d.inputs == {"order": "o-1", "round": 2}
    assert d.deadline_at is not None
    assert run.state.status == "continued"
    assert run.state.chain is not None
    assert run.state.chain.next == d.run_id
    # A finished log takes nothing more.
    assert run.send("tick", {"order": "o-1"}, event_id="t2") == []


def test_the_next_run_takes_over_context_states_key_deadline_and_what_it_took() -> None:
    run = ticking()
    run.send("tick", {"order": "o-1"}, event_id="t1")
    deadline = run.state.timers
    run.send("renew", {"n": 7}, event_id="r1")
    nxt = follow(run)
    started = nxt.log[0]
    assert isinstance(started, ev.RunStarted)
    cf = started.data.continued_from
    assert cf is not None
    assert (cf.run_id, cf.seq, cf.state, cf.link) == ("r-first", run.state.seq, "waiting", 1)
    assert started.data.correlation_key == "o-1"
    assert types(nxt.log) == ["run.started", "timer.scheduled", "state.entered"]
    (timer,) = nxt.state.timers.values()
    assert [t.fire_at for t in deadline.values()] == [timer.fire_at]  # unchanged
    s = nxt.state
    assert s.context == {"ticks": 1, "last": 7}
    assert s.inputs == {"order": "o-1", "round": 2}
    assert s.state == "waiting"
    assert s.transitions == 0
    assert s.chain is not None
    assert s.chain.previous == "r-first"
    assert s.chain.link == 1
    # The event the run before took is not taken again (a redelivery)...
    assert nxt.send("tick", {"order": "o-1"}, event_id="t1") == []
    # ...a new one is, and the chain goes on to its end.
    nxt.send("tick", {"order": "o-1"}, event_id="t3")
    end = nxt.send("finish", event_id="f1")
    assert isinstance(end[-1], ev.RunCompleted)
    assert end[-1].data.outputs == {"round": 2, "ticks": 2}


def test_three_continuations_each_replay_from_their_own_log() -> None:
    run = ticking()
    links = [run]
    for n in range(3):
        links[-1].send("renew", {"n": n}, event_id=f"r{n}")
        links.append(follow(links[-1]))
    assert [link.state.chain.link for link in links if link.state.chain] == [0, 1, 2, 3]
    assert links[-1].state.inputs["round"] == 4
    for link in links:
        again = redrive(link.log, link.definition)
        assert [ev.encode(r) for r in again] == [ev.encode(r) for r in link.log]
        assert replay(link.log, link.definition)["agree"] is True
        assert fold(link.log) == link.state


def test_auto_continues_at_the_first_transition_past_the_suggested_share() -> None:
    run = ticking("history: {max_records: 20}")
    assert run.state.history == ev.HistoryLimits(max_records=20, max_bytes=DEFAULT.max_bytes)
    n = 0
    while run.state.status == "running":
        n += 1
        run.send("tick", {"order": "o-1"}, event_id=f"t{n}")
    last = run.log[-1]
    assert isinstance(last, ev.RunContinued)
    assert last.data.reason == "history.max_records"
    assert run.state.seq >= 16  # 80% of 20
    nxt = follow(run)
    assert nxt.state.history == run.state.history
    assert nxt.state.context["ticks"] == n


def test_never_fails_at_the_limit_with_history_exceeded() -> None:
    run = ticking("history: {max_records: 20, continue_as_new: never}")
    n = 0
    while run.state.status == "running":
        n += 1
        run.send("tick", {"order": "o-1"}, event_id=f"t{n}")
    failed = run.log[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.error.error_class == "history_exceeded"
    assert "history.max_records (20 records)" in failed.data.error.message
    assert "continue_as_new" in failed.data.error.message
    # What would have taken the log past the limit is not recorded.
    assert not any(
        isinstance(r, ev.EventReceived) and r.data.event["id"] == f"t{n}" for r in run.log
    )


def test_a_byte_limit_counts_the_records_as_encoded() -> None:
    run = ticking("history: {max_bytes: 16KiB}")
    big = "x" * 2000
    n = 0
    while run.state.status == "running":
        n += 1
        run.send("tick", {"order": "o-1", "pad": big}, event_id=f"t{n}")
    assert isinstance(run.log[-1], ev.RunContinued)
    assert run.log[-1].data.reason == "history.max_bytes"
    assert run.state.size == sum(len(ev.encode(r)) for r in run.log)
    assert fold(run.log).size == run.state.size


@pytest.mark.parametrize(
    ("text", "size"), [("100", 100), ("64MiB", 64 * 1024**2), ("2 GB", 2 * 10**9), ("1 meg", None)]
)
def test_sizes(text: str, size: int | None) -> None:
    assert parse_size(text) == size


def test_limits_take_the_installation_where_the_workflow_is_silent() -> None:
    definition = compile_one(TICKING.replace("HISTORY", "history: {max_records: 300}"))
    site = ev.HistoryLimits(max_records=1000, max_bytes=10**6, continue_as_new="never")
    assert limits(definition, site) == ev.HistoryLimits(
        max_records=300, max_bytes=10**6, continue_as_new="never"
    )
    plain = compile_one(TICKING.replace("HISTORY", ""))
    assert limits(plain, None) is None  # the default: nothing recorded
    assert limits(plain, site) == site


def test_inputs_a_continuation_gives_are_checked() -> None:
    text = TICKING.replace("HISTORY", "").replace(
        '{round: "{{ inputs.round + 1 }}"}', '{round: "{{ string(inputs.round) }}"}'
    )
    run = Run(compile_one(text), run_id="r-first")
    run.start({"order": "o-1"})
    records = run.send("renew", {"n": 1}, event_id="r1")
    failed: Any = records[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.error.error_class == "schema_error"
    assert "input 'round' must be integer" in failed.data.error.message
