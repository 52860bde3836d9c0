"""The JavaScript worker of examples/agents-js, run under Node against a real stack.

Auth is on: a real nats-server with Interlock's decentralized JWT auth, the orchestrator on
its own credential, and the worker on an agent credential issued by
``interlock creds issue agent --capability demo.greet`` (so it may do only what the
contract lets an agent do). The worker is the one docs/agents-any-language.md describes;
here it completes a run, fails retryably on attempt 1 and succeeds on attempt 2, answers
with its own event type, honours a cancel notice (while the task runs, and one that came
with the task, before it starts), and is listed by ``interlock agents``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import msgspec
import pytest

from interlock.core import events as ev
from interlock.core.objects import parse_ref
from interlock.runtime.client import InterlockClient
from interlock.transport import tasks
from support.node import (
    SUBJECTS,
    WAIT,
    cli,
    copy_example,
    node_or_skip,
    secured_stack,
    start_worker,
    until,
)

pytestmark = pytest.mark.timeout(90)

CAPABILITY = "demo.greet"


async def _pending_acks(client: InterlockClient) -> int:
    info = await client.js.consumer_info(SUBJECTS.tasks_stream, tasks.consumer_name(CAPABILITY))
    return int(info.num_ack_pending)


async def test_a_javascript_worker_serves_a_capability(tmp_path: Path) -> None:
    node, npm = node_or_skip()
    app = copy_example(npm, tmp_path)

    async with secured_stack(tmp_path / "data") as js:
        client = js.client
        creds = await js.issue("agent", "--capability", CAPABILITY, out=tmp_path / "greet.creds")
        env = {
            "INTERLOCK_URL": js.server.url,
            "INTERLOCK_CREDS": str(creds),
            "INTERLOCK_PREFIX": SUBJECTS.prefix,
            "WORKER_NAME": "greeter-js",
            "CAPABILITIES": CAPABILITY,
        }
        worker = await start_worker(node, app, env)
        process = worker.process
        try:
            await worker.wait_for("serving", CAPABILITY)

            # A run completes with the worker's result.
            run = await client.start("greet", {"name": "ada"})
            state = await client.wait(run, timeout=WAIT)
            assert state.status == "completed", state
            assert state.outputs == {"greeting": "hello ada", "attempt": 1}

            # A retryable failure on attempt 1; attempt 2 succeeds.
            run = await client.start("greet", {"name": "bob", "flaky": True})
            state = await client.wait(run, timeout=WAIT)
            assert state.status == "completed", state
            assert state.outputs == {"greeting": "hello bob", "attempt": 2}
            records = await client.read(run)
            failed = [r for r in records if isinstance(r, ev.ActionFailed)]
            assert [(r.data.attempt, r.data.error.retryable) for r in failed] == [(1, True)]

            # A large answer goes by reference, and comes back whole.
            run = await client.start("greet", {"name": "fay", "size": 1_000_000})
            state = await client.wait(run, timeout=WAIT)
            assert state.status == "completed", state
            outputs = await client.payloads.loaded_values(state.outputs, "outputs")
            assert outputs["greeting"] == "hello fay" + "!" * 1_000_000
            [done] = [r for r in await client.read(run) if isinstance(r, ev.ActionCompleted)]
            assert parse_ref(done.data.result).bucket == SUBJECTS.objects_bucket

            # The worker's own event type.
            run = await client.start("greet", {"name": "cy", "emit": True})
            state = await client.wait(run, timeout=WAIT)
            assert (state.status, state.state) == ("completed", "emitted"), state
            assert state.outputs == {"name": "cy"}

            # A cancel notice stops a task in the middle, and the task is acknowledged.
            run = await client.start("greet", {"name": "dee", "wait_seconds": 60})
            action = f"{run}:"
            # Once its handler runs: a notice that reaches the worker with the task itself
            # (the server delivered it, the worker has not read it yet) refuses it before it
            # starts instead, which is another path.
            await worker.wait_for("working on", action)
            assert await _pending_acks(client) == 1
            assert await client.cancel(run)
            await worker.wait_for("cancel notice for", action)
            await worker.wait_for("answered", action, "task.failed")

            async def acked() -> bool:
                return await _pending_acks(client) == 0

            await until(acked, "the cancelled task is acknowledged")
            assert (await client.wait(run, timeout=WAIT)).status == "cancelled"

            # A notice that reaches the worker with its task (the worker, stopped, read
            # neither) refuses the task before its handler starts, and acknowledges it.
            async def queued(count: int = 1) -> bool:
                # Tasks only: the stream also holds its keeper (interlock.runtime.keeper).
                info = await client.js.stream_info(
                    SUBJECTS.tasks_stream, subjects_filter=SUBJECTS.capabilities_all
                )
                return sum((info.state.subjects or {}).values()) == count

            process.send_signal(signal.SIGSTOP)
            try:
                run = await client.start("greet", {"name": "eve", "wait_seconds": 60})
                await until(queued, "the task is dispatched")
                assert await client.cancel(run)
                assert (await client.wait(run, timeout=WAIT)).status == "cancelled"
            finally:
                process.send_signal(signal.SIGCONT)
            action = f"{run}:"
            await worker.wait_for("answered", action, "task.failed")
            assert not [line for line in worker.lines if "working on" in line and action in line]
            await until(lambda: queued(0), "the refused task acknowledged (gone from the stream)")

            # interlock agents lists the worker (its heartbeats).
            code, out = await cli(
                "agents", "--json", "--server", js.server.url, "--creds", str(js.auth.operator)
            )
            assert code == 0, out
            listed = json.loads(out)
            workers = [w for a in listed for w in a["workers"] if w["name"] == "greeter-js"]
            assert len(workers) == 1, listed
            assert workers[0]["capabilities"] == [CAPABILITY]
            assert set(workers[0]) == set(tasks.Heartbeat.__struct_fields__)
            msgspec.convert(workers[0], tasks.Heartbeat)  # the documented types

            # Every answer went by request (way 1) and was replied to: none fell back to
            # the results stream.
            assert not [line for line in worker.lines if "no reply to the answer" in line]
            assert not [line for line in worker.lines if "refused" in line]
        finally:
            assert await worker.stop() == 0, "\n".join(worker.lines)
