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

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from interlock.cli.dev import secure, start_stack, stop_stack
from interlock.core import events as ev
from interlock.core.objects import parse_ref
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport import tasks
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import Subjects
from support.node import ROOT, node_or_skip, npm_install

pytestmark = pytest.mark.timeout(90)

SUBJECTS = Subjects("il")
CAPABILITY = "demo.greet"
WAIT = 20.0

MANIFESTS = (ROOT / "examples" / "agents-js" / "greet.yaml").read_text()


class NodeWorker:
    """``node worker.mjs`` with its output collected line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._new = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())
            self._new.set()

    async def wait_for(self, *words: str) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            for line in self.lines:
                if all(w in line for w in words):
                    return line
            if self.process.returncode is not None or loop.time() > deadline:
                raise AssertionError(f"the worker never said {words}:\n" + "\n".join(self.lines))
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), 0.5)

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.process.wait(), 15)
        except TimeoutError:
            self.process.kill()
            code = await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 5)
        return code


async def _cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "interlock",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


@contextlib.asynccontextmanager
async def secured_stack(data: Path) -> AsyncIterator[tuple[EmbeddedNats, InterlockClient, Path]]:
    auth = secure(data)
    server = EmbeddedNats(data, args=auth.server_args)
    server.start()
    try:
        stack = await start_stack(server.url, auth=auth, agents=False)
        nc = await connect(ConnectOptions.resolve(server.url, creds_file=str(auth.operator)))
        client = InterlockClient(nc, SUBJECTS)
        try:
            applied = await client.apply([("<greet>", MANIFESTS)])
            applied.compiled.raise_for_errors()
            yield server, client, auth.operator
        finally:
            await nc.close()
            await stop_stack(*stack)
    finally:
        server.stop()


async def _pending_acks(client: InterlockClient) -> int:
    info = await client.js.consumer_info(SUBJECTS.tasks_stream, tasks.consumer_name(CAPABILITY))
    return int(info.num_ack_pending)


async def _until(check: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not await check():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


async def test_a_javascript_worker_serves_a_capability(tmp_path: Path) -> None:
    node, npm = node_or_skip()
    app = tmp_path / "agents-js"
    app.mkdir()
    for name in ("package.json", "package-lock.json", "worker.mjs"):
        shutil.copy(ROOT / "examples" / "agents-js" / name, app / name)
    npm_install(npm, app)

    async with secured_stack(tmp_path / "data") as (server, client, operator_creds):
        creds = tmp_path / "greet.creds"
        code, out = await _cli(
            "creds", "issue", "agent", "--capability", CAPABILITY,
            "--keys", str(tmp_path / "data" / "keys"), "-o", str(creds), "--server", server.url,
        )  # fmt: skip
        assert code == 0, out
        env = os.environ | {
            "INTERLOCK_URL": server.url,
            "INTERLOCK_CREDS": str(creds),
            "INTERLOCK_PREFIX": SUBJECTS.prefix,
            "WORKER_NAME": "greeter-js",
        }
        process = await asyncio.create_subprocess_exec(
            node,
            "worker.mjs",
            cwd=app,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        worker = NodeWorker(process)
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

            await _until(acked, "the cancelled task is acknowledged")
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
                await _until(queued, "the task is dispatched")
                assert await client.cancel(run)
                assert (await client.wait(run, timeout=WAIT)).status == "cancelled"
            finally:
                process.send_signal(signal.SIGCONT)
            action = f"{run}:"
            await worker.wait_for("answered", action, "task.failed")
            assert not [line for line in worker.lines if "working on" in line and action in line]
            await _until(lambda: queued(0), "the refused task acknowledged (gone from the stream)")

            # interlock agents lists the worker (its heartbeats).
            code, out = await _cli(
                "agents", "--json", "--server", server.url, "--creds", str(operator_creds)
            )
            assert code == 0, out
            listed = json.loads(out)
            workers = [w for a in listed for w in a["workers"] if w["name"] == "greeter-js"]
            assert len(workers) == 1, listed
            assert workers[0]["capabilities"] == [CAPABILITY]
            assert set(workers[0]) == set(tasks.Heartbeat.__struct_fields__)
            msgspec.convert(workers[0], tasks.Heartbeat)  # the documented types
        finally:
            assert await worker.stop() == 0, "\n".join(worker.lines)
