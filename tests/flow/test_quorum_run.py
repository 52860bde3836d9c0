"""A quorum on a real nats-server: three reviewers, each its own worker (so its answers
come from its own ``source``); the parallel state is done once two distinct reviewers have
answered, and the third reviewer's request is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.flow import WAIT, RecordingAgents, ScriptedStack, of, worker_orchestrator

AGENTS = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: reviewers}
spec:
  capabilities:
    - {name: review.alice, timeout_seconds: 60}
    - {name: review.bob, timeout_seconds: 60}
    - {name: review.carol, timeout_seconds: 60}
"""

PEERS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: peers}
spec:
  initial_state: review
  states:
    review:
      parallel:
        completion: {at_least: 2}
        actions:
          - {capability: review.alice}
          - {capability: review.bob}
          - {capability: review.carol}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
      outputs: {by: "{{ states.review.output.map(r, r.source) }}"}
"""

Stack = ScriptedStack[RecordingAgents]


@contextlib.asynccontextmanager
async def _worker(
    nats_url: str, subjects: Subjects, name: str, handler: Any
) -> AsyncIterator[None]:
    worker = Worker(name, concurrency=1, heartbeat_interval=60)
    worker.capability(f"review.{name}")(handler)
    task = asyncio.create_task(worker.run(nats_url, prefix=subjects.prefix))
    try:
        await asyncio.wait_for(worker.wait_ready(), WAIT)
        yield
    finally:
        await worker.stop(force=True)
        await asyncio.wait_for(task, WAIT)


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, tmp_path: Path) -> AsyncIterator[Stack]:
    files = [tmp_path / "agents.yaml", tmp_path / "peers.yaml"]
    files[0].write_text(AGENTS)
    files[1].write_text(PEERS)
    agents = RecordingAgents(["review.alice"])
    agents.answer("review.alice", {"verdict": "ok"})
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="alice", concurrency=1
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


async def test_two_distinct_reviewers_make_the_quorum(
    stack: Stack, nats_url: str, subjects: Subjects
) -> None:
    carol_asked = asyncio.Event()
    released = asyncio.Event()

    async def bob(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        # bob answers only once carol has her request: all three are asked at once.
        await asyncio.wait_for(carol_asked.wait(), WAIT)
        return {"verdict": "ok"}

    async def carol(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        carol_asked.set()
        # carol answers only after the run has finished: the quorum does not wait for her.
        await asyncio.wait_for(released.wait(), 3 * WAIT)
        return {"verdict": "late"}

    async with (
        _worker(nats_url, subjects, "bob", bob),
        _worker(nats_url, subjects, "carol", carol),
    ):
        run_id = await stack.client.start("peers", {})
        state = await stack.finished(run_id)
        released.set()
    assert state.status == "completed"
    assert sorted(state.outputs["by"]) == ["interlock://agent/alice", "interlock://agent/bob"]
    records = await stack.records(run_id)
    [cancelled] = of(records, ev.ActionCancelled)
    assert cancelled.reason == "parallel reached its quorum"
    carol_request = next(r for r in of(records, ev.ActionRequested) if r.item == 2)
    assert cancelled.action_id == carol_request.action_id
