"""What the orchestrator evaluates away from its event loop: an event or input holding many
values (``heavy_value``), and a workflow with a comprehension anywhere in it
(``may_loop``), whose evaluations can take up to their whole step budget."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core.definition import loops, may_loop
from interlock.core.incoming import HEAVY_VALUES, heavy_value
from support.core import compile_one


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ([1, 2, 3], 3),
        ({"a": 1, "b": "a long text counts as one value"}, 2),
        # Every level counts: 2 keys, 2 items of the list, 1 key of the inner map.
        ({"a": [1, 2], "b": {"c": None}}, 5),
        ([[], {}, [[]]], 4),
    ],
)
def test_a_value_is_heavy_from_the_limit_on(value: Any, count: int) -> None:
    assert heavy_value(value, limit=count)
    assert not heavy_value(value, limit=count + 1)


@pytest.mark.parametrize("scalar", [None, 7, 1.5, True, "x" * 10_000])
def test_a_scalar_is_never_heavy(scalar: Any) -> None:
    assert not heavy_value(scalar, limit=1)


def test_the_default_limit() -> None:
    assert heavy_value(list(range(HEAVY_VALUES)))
    assert not heavy_value(list(range(HEAVY_VALUES - 1)))
    assert heavy_value({"items": [{"n": n} for n in range(HEAVY_VALUES // 2)]})


WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: scan}
spec:
  inputs: {xs: {type: list, default: []}}
  triggers:
    - event: scan.requested
      input: {xs: %(trigger)s}
  correlate:
    key: "{{ inputs.xs }}"
    events: {scan.more: %(correlation)s}
  deadline:
    after: 1h
    goto: done
    set: {late: %(deadline)s}
  initial_state: wait
  states:
    wait:
      on:
        - {event: scan.more, guard: %(guard)s, goto: done}
        - {event: scan.more, goto: done}
    done:
      type: terminal
      outputs: {n: %(output)s}
"""
PLAIN = {
    "trigger": '"{{ data.xs }}"',
    "correlation": "data.key",
    "deadline": '"{{ size(inputs.xs) }}"',
    "guard": "size(data.xs) > 0",
    "output": '"{{ inputs.xs }}"',
}
COMPREHENSION = {
    "trigger": '"{{ data.xs.filter(x, x > 0) }}"',
    "correlation": "\"data.keys.exists(k, k != '')\"",
    "deadline": '"{{ inputs.xs.map(x, x + 1) }}"',
    "guard": '"data.xs.all(x, x > 0)"',
    "output": '"{{ inputs.xs.exists(x, x == 1) }}"',
}


def test_a_workflow_without_a_comprehension_does_not_loop() -> None:
    definition = compile_one(WORKFLOW % PLAIN)
    assert not may_loop(definition)
    assert not loops(definition.states)


@pytest.mark.parametrize("place", sorted(COMPREHENSION))
def test_a_comprehension_anywhere_makes_a_workflow_loop(place: str) -> None:
    """In a trigger's input, a correlation key, the deadline's writes, a guard or a
    terminal state's outputs."""
    definition = compile_one(WORKFLOW % {**PLAIN, place: COMPREHENSION[place]})
    assert may_loop(definition)


def test_loops_looks_into_what_it_is_given() -> None:
    definition = compile_one(WORKFLOW % {**PLAIN, "trigger": COMPREHENSION["trigger"]})
    [trigger] = definition.triggers
    assert loops(trigger.input)
    assert loops([1, "text", None, trigger])
    assert not loops(definition.states)
