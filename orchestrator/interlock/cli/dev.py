"""``interlock dev``: a real nats-server with JetStream, the orchestrator and the reference
agents, in one process tree on one machine.

It lives in the CLI because it wires both sides together: the runtime (the orchestrator)
and the SDK (the reference agents' workers), which never import each other."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from nats.aio.client import Client

import interlock_agents
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.service import Orchestrator
from interlock.sdk import Worker
from interlock.sdk.runner import load_worker
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.errors import NatsServerFailed, NatsServerNotFound

log = logging.getLogger("interlock.dev")

REFERENCE = ("echo", "http-fetch", "command")


async def start_stack(
    url: str, *, prefix: str = "il", agents: bool = True
) -> tuple[Orchestrator, list[Worker], list[asyncio.Task[None]], Client]:
    """Orchestrator plus reference agent workers against ``url`` (AgentDefs applied)."""
    opts = ConnectOptions.resolve(url, prefix=prefix)
    nc = await connect(opts)
    client = InterlockClient(nc, opts.subjects)
    await client.ensure_provisioned()
    if agents:
        sources = [(f"<{name}>", interlock_agents.manifest_text(name)) for name in REFERENCE]
        result = await client.apply(sources)
        result.compiled.raise_for_errors()
    orchestrator = Orchestrator(nc, opts.subjects)
    await orchestrator.start()
    workers: list[Worker] = []
    tasks: list[asyncio.Task[None]] = []
    if agents:
        for name in REFERENCE:
            worker = load_worker(name)
            workers.append(worker)
            tasks.append(asyncio.create_task(worker.run(opts)))
    return orchestrator, workers, tasks, nc


async def stop_stack(
    orchestrator: Orchestrator, workers: list[Worker], tasks: list[asyncio.Task[None]], nc: Client
) -> None:
    for worker in workers:
        with contextlib.suppress(Exception):
            await worker.stop()
    for task in tasks:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    await orchestrator.stop()
    with contextlib.suppress(Exception):
        await nc.close()


def run_dev(data_dir: Path, port: int, *, agents: bool = True) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    server = EmbeddedNats(data_dir, port=port)
    try:
        server.start()
    except (NatsServerNotFound, NatsServerFailed) as exc:
        sys.stderr.write(f"interlock dev: {exc}\n")
        return 2
    print(f"NATS (JetStream) at {server.url}, data in {data_dir}", flush=True)
    print(f"export INTERLOCK_URL={server.url}", flush=True)

    async def main() -> None:
        stack = await start_stack(server.url, agents=agents)
        names = ", ".join(REFERENCE) if agents else "none"
        print(f"orchestrator running; reference agents: {names}. Ctrl-C stops.", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("stopping...", flush=True)
        await stop_stack(*stack)

    try:
        asyncio.run(main())
    finally:
        server.stop()
        print("stopped", flush=True)
    return 0
