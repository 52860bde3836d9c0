"""Large answers collected by a map and a DAG state: each item's or step's answer is kept
by reference, and guards and templates read the collections as if inline (the items of
``states.<map>.output``, ``steps.<step>.output``), those answered in an earlier decision
included (loaded from the run's objects, not at hand as the answer being decided on)."""

from __future__ import annotations

import textwrap

from interlock.core import events as ev
from interlock.core.objects import is_marker
from interlock.transport.subjects import Subjects
from support.objects import PILES_AGENT, pile_worker
from support.runtime import running_stack, serving

MANIFESTS = [
    PILES_AGENT,
    textwrap.dedent(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: piles}
        spec:
          initial_state: many
          states:
            many:
              map:
                over: "[1, 2]"
                as: n
                action: {capability: pile, input: {n: "{{ n }}"}}
              on:
                - event: task.completed
                  guard: >-
                    size(states.many.output[0].blob) == 300 * 1024
                    && size(states.many.output[1].blob) == 300 * 1024 * 2
                  goto: steps
                - {event: task.completed, goto: wrong}
            steps:
              dag:
                steps:
                  first: {action: {capability: pile, input: {n: 1}}}
                  second:
                    depends_on: [first]
                    action:
                      capability: pile
                      input: {n: "{{ size(steps.first.output.blob) / 307200 + 2 }}"}
              on:
                - event: task.completed
                  guard: >-
                    size(states.steps.output.first.output.blob) == 300 * 1024
                    && size(states.steps.output.second.output.blob) == 300 * 1024 * 3
                  goto: done
                - {event: task.completed, goto: wrong}
            done:
              type: terminal
              outputs: {ok: true}
            wrong: {type: terminal}
        """
    ),
]


async def test_collected_large_answers_read_as_if_inline(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, MANIFESTS, worker=False) as stack:
        async with serving(nats_url, subjects, pile_worker()):
            run_id = await stack.client.start("piles", {})
            state = await stack.wait(run_id)
        assert (state.status, state.state) == ("completed", "done"), state
        records = await stack.client.read(run_id)
        answers = [r for r in records if isinstance(r, ev.ActionCompleted)]
        assert len(answers) == 4
        assert all(is_marker(r.data.result) for r in answers)
