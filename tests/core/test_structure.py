"""Structural errors, each worded for the author at its position, and what happens after
them: the malformed parts of the document are dropped (list items from the back) and the
rules of the state machine still run on the rest."""

from __future__ import annotations

from interlock.core.compiler import compile_sources


def found(text: str) -> list[str]:
    return [str(d) for d in compile_sources([("m.yaml", text)]).diagnostics]


def test_a_document_that_is_not_a_mapping_or_has_no_kind() -> None:
    assert found("- a\n- b\n") == ["m.yaml:1:1: wrong-type: a manifest must be a mapping"]
    assert found("apiVersion: interlock.io/v1\nmetadata: {name: x}\n") == [
        "m.yaml:1:1: missing-field: missing required field 'kind'"
    ]
    assert found("apiVersion: interlock.io/v1\nkind: Flow\n") == [
        "m.yaml:2:7: unknown-kind: unknown kind 'Flow' (known: Workflow, AgentDef, Webhook)"
    ]


def test_malformed_parts_are_dropped_and_the_rules_still_run_on_the_rest() -> None:
    """Two bad items of one list (dropped from the back, so the second is not shifted
    onto a good one), unknown keys at the top and inside, a bad optional value: each
    reported, and the state machine's own rules (unreachable, unknown goto) still run."""
    text = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: w, colour: red}
extra: 1
spec:
  initial_state: work
  states:
    work:
      actions: [{capability: echo}, 5, {capability: other}, 7]
      on: [{event: task.completed, goto: done}]
    poll:
      actions: [{capability: echo}, "x"]
      on: [{event: task.completed, goto: nowhere}]
    done: {type: terminal, description: [1]}
"""
    assert found(text) == [
        "m.yaml:3:21: unknown-key: unknown key 'colour' in metadata "
        "(allowed: annotations, description, labels, name, namespace, version)",
        "m.yaml:4:1: unknown-key: unknown key 'extra' in document "
        "(allowed: apiVersion, kind, metadata, spec)",
        "m.yaml:9:37: wrong-type: spec.states.work.actions.1 must be a mapping, got int",
        "m.yaml:9:61: wrong-type: spec.states.work.actions.3 must be a mapping, got int",
        "m.yaml:11:5: no-terminal-path: no terminal state can be reached from state 'poll' "
        "(it has no transitions)",
        "m.yaml:11:5: unreachable-state: state 'poll' cannot be reached from initial state 'work'",
        "m.yaml:12:37: wrong-type: spec.states.poll.actions.1 must be a mapping, got string",
        "m.yaml:13:42: unknown-goto: goto 'nowhere' is not a state (states: work, poll, done)",
        "m.yaml:14:41: wrong-type: spec.states.done.description must be string, got list",
    ]


def test_bad_items_of_a_long_list_are_dropped_by_their_index_as_a_number() -> None:
    """Items 9 and 10 of a list of twelve: 10 goes first (as text "10" sorts before "9",
    which dropped item 9 first and then the good item 11 in its place), so what is left
    decodes and the rules still run on it."""
    on = "\n".join(
        f"        - just text {i}" if i in (9, 10) else f"        - {{event: e{i}, goto: done}}"
        for i in range(12)
    )
    text = f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: many}}
spec:
  initial_state: wait
  states:
    wait:
      on:
{on}
    done: {{type: terminal}}
    other:
      on: [{{event: go, goto: nowhere}}]
"""
    assert found(text) == [
        "m.yaml:18:11: wrong-type: spec.states.wait.on.9 must be a mapping, got string",
        "m.yaml:19:11: wrong-type: spec.states.wait.on.10 must be a mapping, got string",
        "m.yaml:22:5: no-terminal-path: no terminal state can be reached from state 'other' "
        "(it has no transitions)",
        "m.yaml:22:5: unreachable-state: state 'other' cannot be reached from initial state 'wait'",
        "m.yaml:23:30: unknown-goto: goto 'nowhere' is not a state (states: wait, done, other)",
    ]


def test_a_value_out_of_range_and_a_null_where_a_value_is_needed() -> None:
    bounded = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: w}
spec:
  initial_state: work
  states:
    work:
      loop: {until: "true", max_iterations: 0, action: {capability: echo}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal, description: null}
"""
    assert found(bounded) == [
        "m.yaml:8:45: invalid-value: spec.states.work.loop.max_iterations: "
        "0 is less than the minimum of 1"
    ]
    unnamed = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: null}
spec:
  initial_state: done
  states:
    done: {type: terminal}
"""
    assert found(unnamed) == ["m.yaml:3:18: wrong-type: metadata.name must be string, got null"]


def test_a_mapping_where_text_is_expected_is_dropped_whole() -> None:
    """The wrong value goes, not just its keys: what is left decodes, so the rules run."""
    text = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: w}
spec:
  initial_state: work
  states:
    work:
      description: {text: 1}
      actions: [{capability: echo}]
      on: [{event: task.completed, goto: nowhere}]
    done: {type: terminal}
"""
    assert found(text) == [
        "m.yaml:7:5: no-terminal-path: no terminal state can be reached from state 'work' "
        "(it has no transitions)",
        "m.yaml:8:20: wrong-type: spec.states.work.description must be string, got mapping",
        "m.yaml:10:42: unknown-goto: goto 'nowhere' is not a state (states: work, done)",
        "m.yaml:11:5: unreachable-state: state 'done' cannot be reached from initial state 'work'",
    ]
