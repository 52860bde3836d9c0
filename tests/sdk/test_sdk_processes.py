"""Workers as separate processes: a SIGKILL mid-task loses nothing; SIGTERM stops cleanly."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects

SLOW_AGENT = """
import asyncio, sys
from interlock.sdk import Worker

worker = Worker("doomed", ack_wait=1.0)

@worker.capability("slow")
async def slow(inp, ctx):
    print("started", ctx.action_id, flush=True)
    await asyncio.Event().wait()

asyncio.run(worker.run(sys.argv[1], prefix=sys.argv[2]))
"""

RUN_AGENT = """
import asyncio, sys
from interlock.transport.connection import ConnectOptions
from interlock.sdk.runner import run_agent

asyncio.run(run_agent("echo", ConnectOptions.resolve(sys.argv[1], prefix=sys.argv[2]), 2))
print("exited", flush=True)
"""


async def spawn(script: str, nats_url: str, prefix: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        nats_url,
        prefix,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_a_killed_worker_task_is_redelivered_and_answered_once(
    wire, runner, nats_url: str, subjects: Subjects
) -> None:
    doomed = await spawn(SLOW_AGENT, nats_url, subjects.prefix)
    try:
        run_id = f"run{uuid.uuid4().hex[:10]}"
        action = await wire.publish_task("slow", {"n": 1}, run_id=run_id)
        assert doomed.stdout is not None
        line = await asyncio.wait_for(doomed.stdout.readline(), 10)
        assert line.decode().split() == ["started", action]
    finally:
        doomed.send_signal(signal.SIGKILL)
        await doomed.wait()

    survivor = Worker("survivor")
    deliveries: list[int] = []

    @survivor.capability("slow")
    async def slow(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        deliveries.append(ctx.delivery)
        return {"n": inp["n"], "by": "survivor"}

    await runner.start(survivor)
    # Redelivered once the consumer's ack_wait (1 s, set by the first worker) runs out.
    event, _ = await wire.result(run_id)
    assert event.type == "task.completed"
    assert event.data == {"n": 1, "by": "survivor"}
    assert event.source == "interlock://agent/survivor"
    assert deliveries == [2]
    assert await wire.stored_results(run_id) == 1
    assert await wire.tasks_left() in (0, 1)  # the ack may still be in flight


async def test_run_agent_serves_until_sigterm_and_leaves_no_heartbeat(
    wire, nats_url: str, js: JetStreamContext, subjects: Subjects
) -> None:
    workers = await js.key_value(subjects.workers_bucket)
    watcher = await workers.watchall()
    proc = await spawn(RUN_AGENT, nats_url, subjects.prefix)
    try:
        entry = None
        while entry is None or not entry.value:
            entry = await watcher.updates(timeout=10)
        record = json.loads(entry.value)
        assert record["name"] == "echo"
        assert record["capabilities"] == ["echo", "review"]
        assert record["concurrency"] == 2

        run_id = f"run{uuid.uuid4().hex[:10]}"
        await wire.publish_task("review", {"diff": "a\nb\n", "score": 9}, run_id=run_id)
        event, _ = await wire.result(run_id, wait=10)
        assert event.data == {"score": 9, "summary": "echo reviewed 2 line(s) of diff: score 9"}

        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == "exited"
    finally:
        await watcher.stop()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    try:
        await workers.get(entry.key)
    except KeyNotFoundError:
        pass
    else:
        raise AssertionError("the heartbeat outlived the worker")
