"""A DAG state on a real nats-server: a step starts as soon as the steps it depends on
have ended, while unrelated steps are still running (no barrier between "stages"), and a
failure some step depends on takes that branch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.sdk import AgentError, TaskContext
from interlock.transport.subjects import Subjects
from support.flow import WAIT, RecordingAgents, ScriptedStack, of, worker_orchestrator

AGENTS = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: builders}
spec:
  capabilities:
    - {name: build, timeout_seconds: 60}
    - {name: lint, timeout_seconds: 60}
    - {name: test, timeout_seconds: 60}
    - {name: deploy, timeout_seconds: 60}
    - {name: rollback, timeout_seconds: 60}
"""

RELEASE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: release}
spec:
  inputs: {commit: {type: string, required: true}}
  initial_state: ship
  states:
    ship:
      dag:
        steps:
          build: {action: {capability: build, input: {commit: "{{ inputs.commit }}"}}}
          lint: {action: {capability: lint}}
          test:
            depends_on: [build]
            action: {capability: test, input: {wheel: "{{ steps.build.output.wheel }}"}}
          deploy:
            depends_on: [test, lint]
            action: {capability: deploy}
          rollback:
            depends_on: [{step: test, on: failed}]
            action: {capability: rollback}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
      outputs:
        test: "$.states.ship.output.test.status"
        deploy: "$.states.ship.output.deploy.status"
        rollback: "$.states.ship.output.rollback.status"
"""

Stack = ScriptedStack[RecordingAgents]


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, tmp_path: Path) -> AsyncIterator[Stack]:
    files = [tmp_path / "agents.yaml", tmp_path / "release.yaml"]
    files[0].write_text(AGENTS)
    files[1].write_text(RELEASE)
    agents = RecordingAgents(["build", "lint", "test", "deploy", "rollback"])
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="builders", concurrency=8
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


async def test_a_step_starts_while_unrelated_steps_still_run(stack: Stack) -> None:
    # lint finishes only once test has started: with a barrier after build and lint,
    # test could never start and the run would never finish.
    test_started = asyncio.Event()

    async def lint(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        await asyncio.wait_for(test_started.wait(), WAIT)
        return {"lint": "clean"}

    async def test(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        test_started.set()
        return {"passed": inp["wheel"]}

    stack.agents.answer("build", {"wheel": "app.whl"})
    stack.agents.script("lint", lint)
    stack.agents.script("test", test)
    stack.agents.answer("deploy", {"url": "https://example.com"})
    run_id = await stack.client.start("release", {"commit": "c0ffee"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"test": "completed", "deploy": "completed", "rollback": "skipped"}
    records = await stack.records(run_id)
    requested = {r.step: r for r in of(records, ev.ActionRequested)}
    assert requested["test"].input == {"wheel": "app.whl"}
    assert [r.step for r in of(records, ev.StepSkipped)] == ["rollback"]
    assert len(of(records, ev.DagCompleted)) == 1


async def test_a_failure_a_step_depends_on_takes_that_branch(stack: Stack) -> None:
    async def test(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        raise AgentError("3 tests failed")

    stack.agents.answer("build", {"wheel": "app.whl"})
    stack.agents.answer("lint", {})
    stack.agents.script("test", test)
    stack.agents.answer("rollback", {"rolled_back": True})
    run_id = await stack.client.start("release", {"commit": "bad"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"test": "failed", "deploy": "skipped", "rollback": "completed"}
    assert "deploy" not in stack.agents.inputs
