"""The ``unbounded-cycle`` rule over every kind of state that works on its own (a map, a
loop, parallel actions, a DAG) and over graphs where the cycle is not where the search
starts: each cycle the run could go round on its own outcomes alone is reported once, at
the edge that closes it, wherever it lies in the file."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from interlock.core.compiler import compile_sources

HEAD = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: cycles}
spec:
  initial_state: %s
  states:
"""

WORK = {
    "map": "      map: {over: '[1, 2]', as: n, action: {capability: item}}\n",
    "loop": "      loop: {until: result.ready, max_iterations: 3, action: {capability: poll}}\n",
    "parallel": "      parallel: {actions: [{capability: lint}, {capability: test}]}\n",
    "dag": "      dag: {steps: {build: {action: {capability: ci.build}}}}\n",
}


def _diags(text: str) -> list[str]:
    return [
        f"{d.line}:{d.col} {d.rule}: {d.message}"
        for d in compile_sources([("c.yaml", text)]).diagnostics
    ]


def _message(source: str, target: str) -> str:
    return (
        f"unbounded-cycle: {source!r} -> {target!r} closes a cycle the run goes round on its "
        "own outcomes (unguarded, nothing from outside): only the run's transition budget "
        "would end it: count one of its edges against an edge budget (budget: [name], "
        "declared in spec.budget.edges), or declare budget.max_transitions"
    )


@pytest.mark.parametrize("kind", sorted(WORK))
def test_a_state_of_each_kind_of_work_going_back_to_itself_is_a_cycle(kind: str) -> None:
    text = (
        HEAD % "work"
        + "    work:\n"
        + WORK[kind]
        + "      on:\n"
        + "        - {event: task.completed, guard: size(context) > 0, goto: done}\n"
        + "        - {event: task.completed, goto: work}\n"
        + "    done: {type: terminal}\n"
    )
    assert _diags(text) == [f"11:11 {_message('work', 'work')}"]
    bounded = text.replace("  states:\n", "  budget: {max_transitions: 9}\n  states:\n")
    assert _diags(bounded) == []


def test_a_state_that_only_waits_goes_round_only_on_events_from_outside() -> None:
    text = (
        HEAD % "wait"
        + "    wait:\n"
        + "      on:\n"
        + "        - {event: task.completed, goto: wait}\n"
        + "        - {event: go, goto: done}\n"
        + "    done: {type: terminal}\n"
    )
    assert _diags(text) == []


CHAIN = (
    HEAD % "start"
    + """\
    start:
      actions: [{capability: a}]
      on:
        - {event: task.completed, goto: first}
    first:
      actions: [{capability: b}]
      on:
        - {event: task.completed, guard: result.ok, goto: done}
        - {event: task.completed, goto: second}
    second:
      actions: [{capability: c}]
      on:
        - {event: task.completed, goto: first}
    done: {type: terminal}
"""
)


@contextmanager
def _memory_bounded(extra: int = 256 << 20) -> Iterator[None]:
    """At most ``extra`` more bytes of address space inside: a search that never ends
    fails with MemoryError in a second rather than taking the machine's memory."""
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = used + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_cycle_the_search_reaches_from_a_state_outside_it() -> None:
    # start -> first -> second -> first: the cycle does not pass through the state the
    # search begins with, and is closed by second -> first. The search keeps a bounded
    # path, however the states are laid out.
    with _memory_bounded():
        diagnostics = _diags(CHAIN)
    assert diagnostics == [f"19:11 {_message('second', 'first')}"]


DEAD_END_FIRST = (
    HEAD % "hub"
    + """\
    hub:
      actions: [{capability: a}]
      on:
        - {event: task.completed, guard: result.ok, goto: done}
        - {event: task.completed, guard: result.retry, goto: spoke}
      catch:
        - {errors: ["*"], goto: leaf}
        - {errors: ["*"], goto: spoke}
    leaf:
      on:
        - {event: go, goto: done}
    spoke:
      actions: [{capability: b}]
      on:
        - {event: task.completed, goto: hub}
    done: {type: terminal}
"""
)


def test_a_cycle_found_after_a_dead_end_is_reported_at_its_closing_edge() -> None:
    # hub's first catch leads to a state that only waits; its second starts the cycle
    # hub -> spoke -> hub, closed by spoke's edge back to hub.
    assert _diags(DEAD_END_FIRST) == [f"21:11 {_message('spoke', 'hub')}"]


LATER = (
    HEAD % "first"
    + """\
    first:
      actions: [{capability: a}]
      on:
        - {event: task.completed, goto: second}
    second:
      actions: [{capability: b}]
      on:
        - {event: task.completed, guard: result.ok, goto: done}
        - {event: task.completed, guard: result.odd, goto: third}
    third:
      actions: [{capability: c}]
      on:
        - {event: task.completed, guard: result.ok, goto: done}
        - {event: task.completed, goto: third}
    done: {type: terminal}
"""
)


def test_a_cycle_among_states_listed_after_those_already_searched() -> None:
    # first -> second is searched first and ends there (second's edges are guarded); third
    # goes round on its own, listed after both.
    assert _diags(LATER) == [f"20:11 {_message('third', 'third')}"]
