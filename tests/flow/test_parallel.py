"""A parallel state on a real nats-server: different capabilities really run at once, and
the state joins their results in the order of its actions."""

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
metadata: {name: checkers}
spec:
  capabilities:
    - {name: lint, timeout_seconds: 60}
    - {name: test, timeout_seconds: 60}
    - {name: scan, timeout_seconds: 60}
"""

CHECKS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: checks}
spec:
  inputs: {commit: {type: string, required: true}}
  initial_state: checks
  states:
    checks:
      parallel:
        actions:
          - {capability: lint, input: {commit: "{{ inputs.commit }}"}}
          - {capability: test, input: {commit: "{{ inputs.commit }}"}}
          - {capability: scan, input: {commit: "{{ inputs.commit }}"}}
      on:
        - {event: task.completed, goto: release}
      catch:
        - {errors: ["*"], goto: blocked, set: {why: "{{ result.error.message }}"}}
    release: {type: terminal, outputs: {checks: "$.states.checks.output"}}
    blocked: {type: terminal, fail: {message: "{{ context.why }}"}}
"""

Stack = ScriptedStack[RecordingAgents]


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, tmp_path: Path) -> AsyncIterator[Stack]:
    files = [tmp_path / "agents.yaml", tmp_path / "checks.yaml"]
    files[0].write_text(AGENTS)
    files[1].write_text(CHECKS)
    agents = RecordingAgents(["lint", "test", "scan"])
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="checkers", concurrency=8
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


async def test_the_actions_run_at_once_and_join_in_order(stack: Stack) -> None:
    # Each check waits for the next one to have started: run one after the other, they
    # would never finish.
    started = {name: asyncio.Event() for name in ("lint", "test", "scan")}

    def check(name: str, after: str | None) -> Any:
        async def handler(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            started[name].set()
            if after is not None:
                await asyncio.wait_for(started[after].wait(), WAIT)
            return {"check": name, "commit": inp["commit"]}

        return handler

    stack.agents.script("lint", check("lint", "scan"))
    stack.agents.script("test", check("test", "lint"))
    stack.agents.script("scan", check("scan", None))
    run_id = await stack.client.start("checks", {"commit": "c0ffee"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {
        "checks": [
            {"check": "lint", "commit": "c0ffee"},
            {"check": "test", "commit": "c0ffee"},
            {"check": "scan", "commit": "c0ffee"},
        ]
    }
    records = await stack.records(run_id)
    requested = of(records, ev.ActionRequested)
    assert [(a.capability, a.item) for a in requested] == [("lint", 0), ("test", 1), ("scan", 2)]


async def test_one_failing_action_cancels_the_others_and_is_caught(stack: Stack) -> None:
    release = asyncio.Event()

    async def slow(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        await release.wait()
        return {}

    async def red(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        raise AgentError("3 tests failed")

    stack.agents.script("lint", slow)
    stack.agents.script("test", red)
    stack.agents.script("scan", slow)
    try:
        run_id = await stack.client.start("checks", {"commit": "bad"})
        state = await stack.finished(run_id)
    finally:
        release.set()
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.message == "action 1 of parallel 'checks' failed: 3 tests failed"
    cancelled = of(await stack.records(run_id), ev.ActionCancelled)
    assert sorted(c.reason for c in cancelled) == ["parallel failed fast", "parallel failed fast"]
