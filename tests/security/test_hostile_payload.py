"""Answers too large to carry or to record fail their attempt at once with class
``payload_too_large`` in the log (never "timeout: no answer" a minute later), and the CLI
refuses an ``emit`` with a type that cannot be a subject with a clear error; an unrelated
run completes meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.hostile import (
    ECHO_FLOW,
    TIMEOUT,
    bystander_completes,
    cli_env,
    connect,
    run_cli,
    running_stack,
    yaml,
)

BIG_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: bigagent
    spec:
      capabilities:
        - name: big
          timeout_seconds: 120
    """
)

BIG_FLOW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: bigflow
    spec:
      inputs:
        size: {type: integer, required: true}
      initial_state: work
      states:
        work:
          actions:
            - capability: big
              input: {size: "{{ inputs.size }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            blob: "$.states.work.output.blob"
            again: "$.states.work.output.blob"
    """
)


@pytest.mark.parametrize(
    "size",
    [600 * 1024, 1536 * 1024],  # over the bound (set to 512 KiB here); the second over 1 MB
    ids=["600KB", "1.5MB"],
)
async def test_a_too_large_answer_fails_the_attempt_at_once(
    size: int, nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer over the bound of payloads by reference fails its attempt at once, as
    ``payload_too_large`` (under it, it goes by reference: tests/objects)."""
    monkeypatch.setenv("INTERLOCK_OBJECT_MAX_BYTES", "512KiB")
    worker = Worker("bigagent", concurrency=4)

    @worker.capability("big")
    async def big(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return {"blob": "x" * int(inp["size"])}

    async with running_stack(nats_url, subjects, [ECHO_FLOW, BIG_AGENT, BIG_FLOW]) as stack:
        wnc = await connect(nats_url)
        task = asyncio.create_task(worker.run(wnc, prefix=subjects.prefix))
        try:
            await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
            run_id = await stack.client.start("bigflow", {"size": size})
            await bystander_completes(stack)
            state = await stack.wait(run_id)
        finally:
            await asyncio.wait_for(worker.stop(force=True), TIMEOUT)
            await task
            await wnc.close()
        assert state.status == "failed", state
        assert state.error is not None
        assert state.error.error_class == "payload_too_large", state.error
        failed = [r for r in await stack.records(run_id) if isinstance(r, ev.ActionFailed)]
        # Once, as too large: not at the action's timeout (120 s), which fails it as one.
        assert [f.data.error.error_class for f in failed] == ["payload_too_large"]
        assert stack.orchestrator.counters["dead_lettered:processing-failed"] == 0


@pytest.mark.parametrize("event_type", ["bad type", "a..b", "x.>", "*", ""])
def test_emit_refuses_a_type_that_cannot_be_a_subject(
    event_type: str, nats_url: str, subjects: Subjects
) -> None:
    env = cli_env(nats_url, subjects.prefix)
    done = run_cli("emit", event_type, "--source", "test", env=env)
    assert done.returncode != 0, done
    assert "invalid event type" in done.stderr
    assert "Traceback" not in done.stderr
