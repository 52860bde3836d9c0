"""Replay determinism, as properties: for any sequence of events a run may see,

- folding the whole log gives, byte for byte, the state evolved step by step;
- every record survives encode/decode unchanged (and so does the log as JSONL);
- deciding twice on the same (state, event, now) gives the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from interlock.core import events as ev
from interlock.core.definition import Definition, resolve_inputs
from interlock.core.engine import TIMER_FIRED, Incoming, cancel, decide, start
from interlock.core.state import RunState, encode_state, evolve, fold
from interlock.core.vocabulary import ErrorClass
from support.core import ROOT, at, compile_one

STEPS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: steps}
spec:
  context: {rounds: 0}
  initial_state: gather
  states:
    gather:
      actions:
        - capability: fetch
          output: {body: body}
        - capability: review
          input: {text: "{{ context.body }}"}
          output: {score: score}
      on:
        - event: review.approved
          goto: publish
          set: {by: "{{ result.by }}"}
        - event: task.completed
          guard: result.score > 7
          goto: publish
        - event: task.completed
          guard: context.rounds < 2
          goto: gather
          set: {rounds: "{{ context.rounds + 1 }}"}
        - event: task.completed
          goto: rejected
        - event: task.failed
          guard: result.error["class"] == "timeout"
          goto: gather
    publish:
      type: human_in_the_loop
      on:
        - event: approval.granted
          guard: data.approver != ""
          goto: done
          set: {approver: "{{ data.approver }}"}
        - event: approval.denied
          goto: rejected
    done:
      type: terminal
      outputs:
        score: "$.states.gather.output.score"
        approver: "{{ context.approver }}"
        text: "score {{ context.score }} by {{ context.approver }}"
    rejected:
      type: terminal
      outputs: {rounds: "{{ context.rounds }}"}
"""

CONTROL = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: control}
spec:
  budget: {max_transitions: 12, max_actions: 25, max_fan_out: 4}
  inputs: {files: {type: "list[string]", default: [a, b, c]}}
  initial_state: fetch
  states:
    fetch:
      actions:
        - capability: fetch
          timeout: 30s
          retry: {max_attempts: 3, backoff: {initial: 1s, max: 4s}}
      on:
        - {event: task.completed, goto: fan}
        - {event: approval.denied, goto: gave_up}
      catch:
        - {errors: [timeout], goto: gave_up, set: {why: "{{ result.error.message }}"}}
        - {errors: ["*"], goto: fetch}
    fan:
      map:
        over: inputs.files
        as: file
        action: {capability: lint, timeout: 1m, input: {file: "{{ file }}", at: "{{ index }}"}}
        parallelism: 2
        completion: all
      on:
        - {event: task.completed, goto: poll}
      catch:
        - {errors: ["*"], goto: poll}
    poll:
      loop:
        until: result.score > 7
        max_iterations: 3
        action: {capability: status, input: {n: "{{ iteration }}"}}
      on:
        - {event: task.completed, goto: wait}
      catch:
        - {errors: [budget_exceeded], goto: wait}
    wait:
      type: human_in_the_loop
      timeout: {after: 1h, goto: gave_up, set: {why: expired}}
      on:
        - {event: approval.granted, guard: data.approver != "", goto: done}
        - {event: approval.denied, goto: fetch}
    done: {type: terminal, outputs: {lint: "$.states.fan.output", poll: "$.states.poll.output"}}
    gave_up: {type: terminal, outputs: {why: "{{ has(context.why) ? context.why : '' }}"}}
"""

WORKFLOWS: dict[str, Definition] = {
    "code-review": compile_one((ROOT / "examples/code-review.yaml").read_text()),
    "steps": compile_one(STEPS),
    "control": compile_one(CONTROL),
}

AGENT_TYPES = [*["task.completed"] * 6, "task.failed", "review.approved", "x.noted"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
scores = st.integers(-3, 12) | st.floats(-3, 12, allow_nan=False) | st.text(max_size=2) | st.none()
_good_answer = st.fixed_dictionaries(
    {"score": scores},
    optional={
        "summary": st.text(max_size=6),
        "message": st.text(max_size=6),
        "body": st.text(max_size=6),
        "by": st.text(max_size=3),
    },
)
answer_data = st.one_of(
    _good_answer,
    _good_answer,
    _good_answer,
    st.fixed_dictionaries(
        {
            "error": st.fixed_dictionaries(
                {
                    "class": st.sampled_from([*ErrorClass, "odd"]),
                    "message": st.text(max_size=5),
                }
            )
        }
    ),
    json_values,
)
_approval = st.fixed_dictionaries({"approver": st.sampled_from(["alice", "bob", "", "mallory"])})
external_data = st.one_of(
    _approval,
    _approval,
    st.fixed_dictionaries({"approver": st.integers(0, 3)}),
    json_values,
)


@dataclass(frozen=True)
class Answer:
    which: str  # "pending", "stale" or "unknown"
    type: str
    data: Any
    event_id: int


@dataclass(frozen=True)
class External:
    choice: int
    """Which of the event types the run's current state waits for (or one it does not)."""
    data: Any
    source: int
    event_id: int


@dataclass(frozen=True)
class Timer:
    choice: int
    """Which of the run's timers comes due (or one it does not have)."""


@dataclass(frozen=True)
class Repeat:
    back: int


@dataclass(frozen=True)
class Cancel:
    reason: str


_answers = st.builds(
    Answer,
    st.sampled_from(["pending", "pending", "pending", "stale", "unknown"]),
    st.sampled_from(AGENT_TYPES),
    answer_data,
    st.integers(0, 3),
)
_externals = st.builds(
    External, st.integers(0, 7), external_data, st.integers(0, 1), st.integers(0, 2)
)
_ordinary = st.one_of(
    _answers,
    _answers,
    _externals,
    st.builds(Repeat, st.integers(1, 4)),
    st.builds(Timer, st.integers(0, 5)),
)
# A cancel ends the run, so it comes rarely (one move in forty) to leave room for the rest;
# not at 0 or 39, the values hypothesis favours.
moves = st.lists(
    st.integers(0, 39).flatmap(
        lambda n: st.builds(Cancel, st.text(max_size=5)) if n == 17 else _ordinary
    ),
    min_size=4,
    max_size=40,
)


def incoming_for(
    definition: Definition,
    move: Answer | External | Repeat | Timer,
    state: RunState,
    log: list[ev.AnyRecord],
    sent: list[Incoming],
) -> Incoming | None:
    if isinstance(move, Repeat):
        return sent[-move.back] if len(sent) >= move.back else None
    if isinstance(move, Timer):
        timers = [*sorted(state.timers), f"{state.run_id}:0"]
        timer_id = timers[move.choice % len(timers)]
        return Incoming(
            type=TIMER_FIRED,
            source="interlock://timers",
            id=f"timer-{timer_id}",
            extensions={"timerid": timer_id},
        )
    if isinstance(move, External):
        # Mostly what the state waits for; sometimes an event it does not, or a task.*
        # event without an action id (taken like any external event).
        waiting = definition.states[state.state].by_event if state.state else {}
        waited = sorted(t for t in waiting if not t.startswith("task."))
        choices = [*waited, *waited, "unrelated.thing", "task.completed"]
        return Incoming(
            type=choices[move.choice % len(choices)],
            source=f"urn:source:{move.source}",
            id=f"e-{move.event_id}",
            data=move.data,
        )
    requested = [r.data.action_id for r in log if isinstance(r, ev.ActionRequested)]
    extensions: dict[str, str] = {}
    if move.which == "pending" and state.pending:
        pending = sorted(state.pending)
        action_id = pending[move.event_id % len(pending)]
        extensions["attempt"] = str(state.pending[action_id].attempt)
    elif move.which == "stale" and requested:
        action_id = requested[move.event_id % len(requested)]
    else:
        action_id = f"{state.run_id}:999"
    return Incoming(
        type=move.type,
        source="interlock://agent/prop",
        id=f"a-{move.event_id}",
        data=move.data,
        extensions={"actionid": action_id, **extensions},
    )


def check_run(definition: Definition, inputs: dict[str, Any], plan: list[Any]) -> None:
    resolved, problems = resolve_inputs(definition, inputs)
    assert problems == []
    log: list[ev.AnyRecord] = list(start(definition, run_id="r-prop", inputs=resolved, now=at(0)))
    state = fold(log)
    sent: list[Incoming] = []
    for step, move in enumerate(plan, start=1):
        now = at(step)
        if isinstance(move, Cancel):
            out = cancel(definition, state, reason=move.reason, now=now)
            again = cancel(definition, state, reason=move.reason, now=now)
        else:
            incoming = incoming_for(definition, move, state, log, sent)
            if incoming is None:
                continue
            sent.append(incoming)
            out = decide(definition, state, incoming, now)
            again = decide(definition, state, incoming, now)
        assert [ev.encode(r) for r in out] == [ev.encode(r) for r in again]
        for record in out:
            state = evolve(state, record)
        log.extend(out)
        if state.finished:
            assert out == [] or ev.record_type(out[-1]) in ev.TERMINAL_TYPES
    event(f"status: {state.status}")
    for kind in sorted({ev.record_type(r).removeprefix(ev.PREFIX) for r in log}):
        event(f"record: {kind}")
    # the replay guarantee
    assert encode_state(fold(log)) == encode_state(state)
    encoded = [ev.encode(r) for r in log]
    for record, data in zip(log, encoded, strict=True):
        decoded = ev.decode(data)
        assert decoded == record
        assert ev.encode(decoded) == data
    jsonl = b"\n".join(encoded) + b"\n"
    assert encode_state(fold(ev.decode_lines(jsonl))) == encode_state(state)
    # the log is well formed: one run, consecutive ids, finished at most once, at the end
    assert state.seq == len(log)
    assert [r.id for r in log] == [f"r-prop:{i}" for i in range(1, len(log) + 1)]
    finals = [i for i, r in enumerate(log) if ev.record_type(r) in ev.TERMINAL_TYPES]
    assert finals in ([], [len(log) - 1])


PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@PROPERTY
@given(score=st.integers(0, 10), plan=moves)
def test_code_review_replays(score: int, plan: list[Any]) -> None:
    check_run(WORKFLOWS["code-review"], {"repository": "a/b", "pr": 1, "score": score}, plan)


@PROPERTY
@given(plan=moves)
def test_steps_replays(plan: list[Any]) -> None:
    check_run(WORKFLOWS["steps"], {}, plan)


@PROPERTY
@given(plan=moves)
def test_control_flow_replays(plan: list[Any]) -> None:
    check_run(WORKFLOWS["control"], {}, plan)


@PROPERTY
@given(plan=moves, cut=st.integers(0, 40))
def test_folding_in_two_parts_equals_folding_at_once(plan: list[Any], cut: int) -> None:
    definition = WORKFLOWS["steps"]
    log: list[ev.AnyRecord] = list(start(definition, run_id="r", inputs={}, now=at(0)))
    state = fold(log)
    sent: list[Incoming] = []
    for step, move in enumerate(plan, start=1):
        if isinstance(move, Cancel):
            continue
        incoming = incoming_for(definition, move, state, log, sent)
        if incoming is None:
            continue
        sent.append(incoming)
        out = decide(definition, state, incoming, at(step))
        state = fold(out, state)
        log.extend(out)
    cut = min(cut, len(log))
    assert encode_state(fold(log[cut:], fold(log[:cut]))) == encode_state(fold(log))
