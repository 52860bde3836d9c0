"""An agent reports what its answer cost, and a workflow's ``budget.max_cost`` is the sum
of what the agents of its run reported: one team's agent cannot lower what another team's
agents spent in the same run (a negative ``cost``), so a budget binds whoever else answers.
Each team's worker on its own credential as ``interlock creds issue`` makes it (the SDK),
a real nats-server with Interlock's decentralized auth."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.sdk import Worker
from interlock.transport.connection import ConnectOptions
from support.auth import Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

MANIFESTS = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: costs
    spec:
      capabilities:
        - {name: cheap, input_schema: {type: object}, output_schema: {type: object}}
        - {name: dear, input_schema: {type: object}, output_schema: {type: object}}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: budgeted
    spec:
      budget: {max_cost: 5}
      initial_state: first
      states:
        first:
          actions:
            - {capability: cheap, input: {}}
          on:
            - {event: task.completed, goto: second}
        second:
          actions:
            - {capability: dear, input: {}}
          on:
            - {event: task.completed, goto: done}
          catch:
            - {errors: [budget_exceeded], goto: over}
        done: {type: terminal}
        over: {type: terminal}
    """
)


@asynccontextmanager
async def serving(secured: Secured, capability: str, cost: float) -> AsyncIterator[None]:
    """A worker of ``capability`` on its own team's credential, each answer costing ``cost``."""
    creds = secured.issue(Role("agent", capabilities=(capability,)), f"team-{capability}")
    worker = Worker(f"team-{capability}", grace_period=1.0)

    @worker.capability(capability)
    async def answer(inp: dict[str, Any]) -> dict[str, Any]:
        return {"cost": cost}

    task = asyncio.create_task(
        worker.run(ConnectOptions.resolve(secured.url, creds_file=str(creds)))
    )
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        yield
    finally:
        await worker.stop(force=True)
        await task


async def test_an_agent_cannot_make_room_in_a_runs_cost_budget(secured: Secured) -> None:
    applied = await secured.operator.apply([("<costs>", MANIFESTS)])
    applied.compiled.raise_for_errors()
    async with serving(secured, "cheap", -1000), serving(secured, "dear", 10):
        run_id = await secured.operator.start("budgeted", {}, run_id="cost-1")
        state = await secured.operator.wait(run_id, timeout=30)
    # The dear capability's 10 is over the budget of 5, whatever the cheap one said.
    assert state.state == "over"
    completed = [
        r for r in await secured.operator.read(run_id) if isinstance(r, ev.ActionCompleted)
    ]
    assert [r.data.cost for r in completed] == [None, 10.0]
