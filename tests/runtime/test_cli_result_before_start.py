"""``interlock result --wait`` for the run an emit said its event starts, asked before any
orchestrator has started it: it waits for the run to start, then to end (the emitting
client itself is told the run is not started yet)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from interlock.client import Client
from interlock.runtime.errors import RunNotStarted
from interlock.runtime.service import Orchestrator
from interlock.transport.subjects import Subjects
from support.runtime import STARTUP_TIMEOUT, cli_env, connect, interlock_bg

GREETED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: greeted}
spec:
  inputs:
    message: {type: string, required: true}
  triggers:
    - event: com.example.greeted
  initial_state: done
  states:
    done:
      type: terminal
      outputs: {echoed: "{{ inputs.message }}"}
"""


async def test_result_wait_waits_for_the_run_an_event_starts(nats_url: str) -> None:
    prefix = f"rb{uuid.uuid4().hex[:10]}"
    nc = await connect(nats_url)
    client = Client(nc, prefix=prefix)
    orchestrator = Orchestrator(nc, Subjects(prefix))
    try:
        [applied] = await client.apply([("greeted.yaml", GREETED)])
        assert applied.name == "greeted", applied
        emitted = await client.emit(
            type="com.example.greeted", source="/t", id="g1", data={"message": "hi"}, wait=0
        )
        [started] = emitted.started
        # No orchestrator yet: the run is not started (this client was told of it).
        with pytest.raises(RunNotStarted, match="not started yet"):
            await client.result(started.run_id)

        env = cli_env(nats_url, prefix)
        waiting = interlock_bg("result", started.run_id, "--wait", "--timeout", "120", env=env)
        await orchestrator.start()
        code = await asyncio.to_thread(waiting.wait, STARTUP_TIMEOUT)
        assert code == 0, waiting.output
        assert json.loads(waiting.output) == {"echoed": "hi"}
    finally:
        await orchestrator.stop()
        await nc.close()
