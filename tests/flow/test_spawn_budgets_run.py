"""Spawn budgets across a tree of runs, on a real nats-server: ctxmesh files that go over
their ``maxTotalSpawns`` / ``maxSpawnDepth``, loaded as written, and a native parent whose
``max_total_spawns`` / ``max_spawn_depth`` its child run (a ctxmesh workflow) shares. What
a child spent reaches its parent with the child's end, through the results stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from interlock.core import events as ev
from interlock.runtime.flow import child_run_id
from interlock.transport.subjects import Subjects
from support.flow import REPO, RecordingAgents, ScriptedStack, of, worker_orchestrator

BUDGET = REPO / "tests" / "dialects" / "fixtures" / "budget"
Stack = ScriptedStack[RecordingAgents]

PARENT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: delegate, namespace: my-team}
spec:
  budget: {max_total_spawns: 3, max_spawn_depth: 2}
  initial_state: ask
  states:
    ask:
      actions: [{workflow: my-team/shallow-answer, input: {topic: "{{ inputs.topic }}"}}]
      on: [{event: task.completed, goto: wrap}]
      catch:
        - {errors: [budget_exceeded], goto: refused, set: {why: "{{ result.error.code }}"}}
    wrap:
      actions: [{capability: writer-agent, input: {topic: wrap}}]
      on: [{event: task.completed, goto: done}]
      catch:
        - {errors: [budget_exceeded], goto: refused, set: {why: "{{ result.error.code }}"}}
    done: {type: terminal}
    refused: {type: terminal, outputs: {why: "{{ context.why }}"}}
"""


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, tmp_path: Path) -> AsyncIterator[Stack]:
    depth_zero = tmp_path / "ctxmesh-no-depth.yaml"
    depth_zero.write_text(
        (BUDGET / "ctxmesh-spawn-depth.yaml")
        .read_text()
        .replace("name: shallow-answer", "name: no-depth")
        .replace("maxSpawnDepth: 1", "maxSpawnDepth: 0")
    )
    no_budget = tmp_path / "ctxmesh-no-budget.yaml"
    no_budget.write_text(
        (BUDGET / "ctxmesh-spawn-total.yaml")
        .read_text()
        .replace("name: answer-each-topic", "name: answer-every-topic")
        .replace("  budget:\n    maxTotalSpawns: 3\n", "")
    )
    parents = tmp_path / "parents.yaml"
    parents.write_text(
        PARENT
        + "---\n"
        + PARENT.replace("name: delegate,", "name: delegate-tight,").replace(
            "max_total_spawns: 3, max_spawn_depth: 2", "max_total_spawns: 1"
        )
        + "---\n"
        + PARENT.replace("name: delegate,", "name: delegate-shallow,").replace(
            "max_total_spawns: 3, max_spawn_depth: 2", "max_spawn_depth: 1"
        )
    )
    files = [*sorted(BUDGET.glob("ctxmesh-*.yaml")), depth_zero, no_budget, parents]
    agents = RecordingAgents(["splitter-agent", "writer-agent"])
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="spawn-worker", concurrency=4
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


def _requested(records: list[ev.AnyRecord]) -> list[ev.ActionRequestedData]:
    return of(records, ev.ActionRequested)


async def test_a_ctxmesh_map_over_max_total_spawns_fails_at_the_launch_over_it(
    stack: Stack,
) -> None:
    stack.agents.answer("splitter-agent", {"topics": ["a", "b", "c"]})
    stack.agents.answer("writer-agent", {"text": "ok"})
    run_id = await stack.client.start("my-team/answer-each-topic", {})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    records = await stack.records(run_id)
    assert len(_requested(records)) == 3  # split + two topics; the third is not launched
    refused = [r for r in of(records, ev.ActionFailed) if r.error.code]
    assert [(r.item, r.error.code) for r in refused] == [(2, "max_total_spawns")]
    assert stack.agents.inputs["writer-agent"] == [{"topic": "a"}, {"topic": "b"}]


async def test_a_ctxmesh_map_within_max_total_spawns_completes(stack: Stack) -> None:
    stack.agents.answer("splitter-agent", {"topics": ["a", "b"]})
    stack.agents.answer("writer-agent", {"text": "ok"})
    run_id = await stack.client.start("my-team/answer-each-topic", {})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.spawn is not None
    assert (state.spawn.allowance, state.spawn.used) == (3, 3)


async def test_without_a_budget_ctxmesh_defaults_bound_the_launches(stack: Stack) -> None:
    # No budget block: ctxmesh's defaults apply (maxTotalSpawns 20, maxSpawnDepth 3).
    topics = [f"t{i}" for i in range(25)]
    stack.agents.answer("splitter-agent", {"topics": topics})
    stack.agents.answer("writer-agent", {"text": "ok"})
    run_id = await stack.client.start("my-team/answer-every-topic", {})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.spawn is not None
    assert (state.spawn.allowance, state.spawn.max_depth) == (20, 3)
    records = await stack.records(run_id)
    assert len(_requested(records)) == 20  # split + 19 topics; the 20th topic is refused
    refused = [r for r in of(records, ev.ActionFailed) if r.error.code]
    assert [(r.item, r.error.code) for r in refused] == [(19, "max_total_spawns")]


async def test_a_ctxmesh_file_over_max_spawn_depth_launches_nothing(stack: Stack) -> None:
    run_id = await stack.client.start("my-team/no-depth", {"topic": "x"})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert (state.error.error_class, state.error.code) == ("budget_exceeded", "max_spawn_depth")
    assert _requested(await stack.records(run_id)) == []
    assert "writer-agent" not in stack.agents.inputs


async def test_a_child_is_charged_only_what_it_spent(stack: Stack) -> None:
    stack.agents.answer("writer-agent", {"text": "ok"})
    run_id = await stack.client.start("my-team/delegate", {"topic": "billing"})
    state = await stack.finished(run_id)
    # ask (spawn 1) hands the child the other 2, reserved; the child spends 1 on its one
    # node and reports it, so wrap is the third spawn and runs.
    assert state.status == "completed", state.error
    assert state.state == "done"
    records = await stack.records(run_id)
    ask = _requested(records)[0]
    assert ask.spawn == ev.SpawnBudget(depth=1, max_depth=2, allowance=2)
    child = child_run_id(ask.action_id, 1)
    child_records = await stack.records(child)
    started = child_records[0]
    assert isinstance(started, ev.RunStarted)
    # The ctxmesh workflow's own maxSpawnDepth (1, from depth 1: 2) keeps the parent's 2.
    assert started.data.spawn == ev.SpawnBudget(depth=1, max_depth=2, allowance=2)
    end = child_records[-1]
    assert isinstance(end, ev.RunCompleted)
    assert end.data.spawns == 1
    answered = of(records, ev.ActionCompleted)[0]
    assert answered.spawns == 1
    assert stack.agents.inputs["writer-agent"] == [{"topic": "billing"}, {"topic": "wrap"}]


async def test_a_child_with_no_allowance_left_fails_the_parents_action(stack: Stack) -> None:
    run_id = await stack.client.start("my-team/delegate-tight", {"topic": "billing"})
    state = await stack.finished(run_id)
    assert state.state == "refused"
    assert state.outputs == {"why": "max_total_spawns"}
    assert "writer-agent" not in stack.agents.inputs


async def test_a_child_too_deep_for_its_parents_depth_fails_the_parents_action(
    stack: Stack,
) -> None:
    run_id = await stack.client.start("my-team/delegate-shallow", {"topic": "billing"})
    state = await stack.finished(run_id)
    assert state.state == "refused"
    assert state.outputs == {"why": "max_spawn_depth"}
    ask = _requested(await stack.records(run_id))[0]
    child = await stack.records(child_run_id(ask.action_id, 1))
    assert isinstance(child[0], ev.RunStarted)
    # The child's own maxTotalSpawns is ctxmesh's default (20): its file sets none.
    assert child[0].data.spawn == ev.SpawnBudget(depth=1, max_depth=1, allowance=20)
    assert "writer-agent" not in stack.agents.inputs
