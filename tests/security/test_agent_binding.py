"""An agent never creates its capability's consumer on a secured installation, nor tries
to (its account has no JetStream of its own): it says once that it waits for the
orchestrator, and binds as soon as the orchestrator has made the consumer (when an AgentDef
of the capability is applied). Real nats-server with Interlock's decentralized auth, a
worker of the SDK on an agent credential."""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time

import pytest

from interlock.auth.roles import Role
from interlock.sdk import Worker
from interlock.transport.connection import ConnectOptions
from interlock.transport.tasks import consumer_name
from support.auth import SUBJECTS, Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

LATE = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: late
    spec:
      capabilities:
        - name: late
          input_schema: {type: object}
          output_schema: {type: object}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: late-work
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: late
              input: {n: 1}
          on:
            - event: task.completed
              goto: done
        done:
          type: terminal
          outputs:
            n: "$.states.work.output.n"
    """
)


async def _until(probe: object, what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached after {within}s: {what}")
        await asyncio.sleep(0.05)


async def test_a_worker_waits_for_the_orchestrator_to_make_its_consumer(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="interlock.sdk")
    caplog.set_level(logging.WARNING, logger="interlock.nats")
    creds = secured.issue(Role("agent", capabilities=("late",)), "late-agent")
    worker = Worker("late-agent", grace_period=1.0)

    @worker.capability("late")
    async def late(inp: dict[str, int]) -> dict[str, int]:
        return inp

    options = ConnectOptions.resolve(secured.url, creds_file=str(creds))
    serving = asyncio.create_task(worker.run(options))
    js = secured.operator.js
    try:

        async def says_it_waits() -> bool:
            return "waiting for the orchestrator to create it" in caplog.text

        await _until(says_it_waits, "the worker's line about waiting")
        names = {c.name for c in await js.consumers_info(SUBJECTS.tasks_stream)}
        assert consumer_name("late") not in names  # the agent could not make it
        # Nor did it try: a create would be a permissions violation answered by nobody,
        # a warning and a request timeout before the line saying what it waits for.
        assert "may not create" not in caplog.text
        assert "permissions violation" not in caplog.text
        assert not serving.done()

        applied = await secured.operator.apply([("<late>", LATE)])
        applied.compiled.raise_for_errors()
        await asyncio.wait_for(worker.wait_ready(), 30)
        run_id = await secured.operator.start("late-work", {})
        state = await secured.operator.wait(run_id, timeout=30)
        assert state.status == "completed"
        assert state.outputs == {"n": 1}

        # The AgentDef applied after it started reached it too, read with an agent's
        # rights (direct gets, no consumer), on hearing the write.
        async def knows_the_contract() -> bool:
            return worker._catalog.get("late") is not None

        await _until(knows_the_contract, "the AgentDef in the worker's catalog", within=10)
    finally:
        await worker.stop(force=True)
        await serving
