"""``interlock result --wait`` for the run an ``interlock emit`` said its event starts, asked
before any orchestrator has started it: it waits for the run to start, then to end."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from interlock.runtime.service import Orchestrator
from interlock.transport.subjects import Subjects
from support.runtime import STARTUP_TIMEOUT, cli_env, connect, interlock_bg, run_cli

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


async def test_result_wait_waits_for_the_run_an_event_starts(nats_url: str, tmp_path: Path) -> None:
    prefix = f"rb{uuid.uuid4().hex[:10]}"
    env = cli_env(nats_url, prefix)
    (tmp_path / "greeted.yaml").write_text(GREETED)
    applied = run_cli("apply", "greeted.yaml", env=env, cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    emitted = run_cli(
        "emit", "com.example.greeted", "--source", "/t", "--id", "g1",
        "--data", '{"message": "hi"}', "--output", "json", env=env,
    )  # fmt: skip
    assert emitted.returncode == 0, emitted.stderr
    [started] = json.loads(emitted.stdout)["started"]
    run_id = started["run_id"]
    # No orchestrator yet: the run does not exist (this process was not told of it).
    now = run_cli("result", run_id, env=env)
    assert now.returncode == 4, now.stderr
    assert "no run" in now.stderr

    waiting = interlock_bg("result", run_id, "--wait", "--timeout", "120", env=env)
    nc = await connect(nats_url)
    orchestrator = Orchestrator(nc, Subjects(prefix))
    try:
        await orchestrator.start()
        code = await asyncio.to_thread(waiting.wait, STARTUP_TIMEOUT)
        assert code == 0, waiting.output
        assert json.loads(waiting.output) == {"echoed": "hi"}
    finally:
        await orchestrator.stop()
        await nc.close()
