"""The rules over a whole workflow: every ``$.states.<s>.output`` reference, wherever a
value can hold one, names a state that exists and produces an output; a workflow without
a terminal state, and a state with no way out, are refused with a message that says so."""

from __future__ import annotations

import pytest

from interlock.core.compiler import compile_sources

EVERYWHERE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: refs}
spec:
  initial_state: work
  deadline: {after: 1h, goto: failed, set: {j: "REF"}}
  states:
    work:
      actions: [{capability: echo, input: {a: "REF"}}]
      on: [{event: task.completed, goto: fan, set: {b: "REF"}}]
      catch: [{errors: ["*"], goto: failed, set: {c: "REF"}}]
      timeout: {after: 5m, goto: failed, set: {d: "REF"}}
    fan:
      map: {over: "[1]", as: x, action: {capability: echo, input: {e: "REF"}}}
      on: [{event: task.completed, goto: par}]
    par:
      parallel:
        actions: [{capability: echo, input: {f: "REF"}}, {capability: b, input: {g: "REF"}}]
      on: [{event: task.completed, goto: again}]
    again:
      loop: {until: "true", max_iterations: 2, action: {capability: echo, input: {h: "REF"}}}
      on: [{event: task.completed, goto: done}]
    done:
      type: terminal
      outputs: {i: "REF"}
    failed:
      type: terminal
      fail: {message: "REF"}
"""
"""A reference in each place a value is checked, ``REF`` standing for it (positions below
are those of a 22-character reference)."""

PLACES = [
    "6:48",  # spec.deadline.set
    "9:43",  # an action's input
    "10:56",  # a transition's set
    "11:54",  # a catch's set
    "12:51",  # the timeout's set
    "14:67",  # the map action's input
    "18:45",  # the first parallel action's input
    "18:100",  # the second parallel action's input (after the first reference)
    "21:82",  # the loop action's input
    "25:20",  # a terminal state's outputs
    "28:23",  # the fail message
]


def found(text: str) -> list[str]:
    return [
        f"{d.line}:{d.col} {d.rule}: {d.message}"
        for d in compile_sources([("m.yaml", text)]).diagnostics
    ]


def test_a_reference_to_a_missing_state_is_reported_wherever_it_is() -> None:
    message = "unknown-state-ref: $.states.nope refers to a state that does not exist"
    assert found(EVERYWHERE.replace("REF", "$.states.nope.output.x")) == [
        f"{place} {message}" for place in PLACES
    ]


def test_a_reference_to_a_state_without_output_is_reported_wherever_it_is() -> None:
    message = (
        "no-output-ref: $.states.done.output refers to a state that produces no output "
        "(only states with actions, a map or a loop do)"
    )
    assert found(EVERYWHERE.replace("REF", "$.states.done.output.x")) == [
        f"{place} {message}" for place in PLACES
    ]


@pytest.mark.parametrize("state", ["work", "fan", "par", "again"])
def test_states_with_actions_a_map_a_parallel_or_a_loop_produce_an_output(state: str) -> None:
    assert found(EVERYWHERE.replace("REF", f"$.states.{state}.output")) == []


def test_a_workflow_without_a_terminal_state_is_refused_once() -> None:
    text = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: loops}
spec:
  initial_state: a
  states:
    a:
      actions: [{capability: echo}]
      on: [{event: task.completed, goto: b}]
    b:
      on: [{event: go, goto: a}]
"""
    compiled = compile_sources([("m.yaml", text)])
    assert [str(d) for d in compiled.diagnostics] == [
        "m.yaml:7:5: no-terminal-path: the workflow has no terminal state "
        "(add one with type: terminal)"
    ]


def test_a_state_without_transitions_is_named_as_such() -> None:
    text = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: stuck}
spec:
  initial_state: a
  states:
    a:
      actions: [{capability: echo}]
      on: [{event: task.completed, goto: b}, {event: other, goto: done}]
    b:
      actions: [{capability: echo}]
    c:
      on: [{event: again, goto: c}]
    done: {type: terminal}
"""
    assert found(text) == [
        "10:5 no-terminal-path: no terminal state can be reached from state 'b' "
        "(it has no transitions)",
        "12:5 no-terminal-path: no terminal state can be reached from state 'c'",
        "12:5 unreachable-state: state 'c' cannot be reached from initial state 'a'",
    ]
