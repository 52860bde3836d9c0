"""The workflow view's state machine (what the console draws): every kind of edge, in the
manifest's order, and each state's kind. Pure: compiled manifests, no server."""

from __future__ import annotations

import textwrap

import msgspec

from interlock.core.compiler import compile_sources
from interlock.views.build import workflow_detail
from interlock.views.outline import transitions_of

EDGES = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: edges
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: {}
          on:
            - {event: task.completed, guard: "result.ok", goto: done}
            - {event: task.completed, goto: review}
          catch:
            - {errors: [timeout, agent_error], goto: failed}
        review:
          type: human_in_the_loop
          timeout: {after: 1h, goto: failed}
          on:
            - {event: approval.granted, goto: done}
        done:
          type: terminal
        failed:
          type: terminal
    """
)


def test_every_edge_of_the_state_machine_in_the_manifests_order() -> None:
    compiled = compile_sources([("edges.yaml", EDGES)])
    assert not compiled.diagnostics, compiled.diagnostics
    [definition] = compiled.workflows
    edges = msgspec.to_builtins(transitions_of(definition))
    assert edges == [
        {
            "from": "work",
            "to": "done",
            "kind": "on",
            "event": "task.completed",
            "guard": "result.ok",
            "index": 0,
        },
        {"from": "work", "to": "review", "kind": "on", "event": "task.completed", "index": 1},
        {"from": "work", "to": "failed", "kind": "catch", "event": "agent_error,timeout"},
        {"from": "review", "to": "done", "kind": "on", "event": "approval.granted", "index": 0},
        {"from": "review", "to": "failed", "kind": "timeout"},
    ]
    detail = workflow_detail(definition, 3, [1, 3, 2])
    assert (detail.version, detail.versions) == (3, [1, 2, 3])
    assert detail.kinds == {
        "work": "normal",
        "review": "human_in_the_loop",
        "done": "terminal",
        "failed": "terminal",
    }
    assert detail.transitions == transitions_of(definition)
