"""Fair share under one concurrency limit: does a flood of one key hold up another key?

Starts a fresh embedded nats-server, an orchestrator and a worker in this process (the
worker answers at once), and a workflow whose runs share ``--limit`` slots (key ``"all"``).
For fair share off and on (``fair: inputs.customer``), three phases, each on a fresh
prefix: key B alone starts ``--few`` runs; then key A starts ``--flood`` runs and, as soon
as they are in, key B its ``--few``. A run's time to start is from its ``run.started`` to
its ``run.admitted`` (both in its log, one clock). Printed: B's median time to start in the
flood against the same median alone (measured in the same invocation), as a ratio; the
goal with fair share on is at most 2x.

    python -m bench fairness [--flood 5000] [--few 50] [--limit 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.service import Orchestrator
from interlock.sdk import TaskContext, Worker
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import Subjects

AGENT = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: fastagent}
spec:
  capabilities:
    - name: fast
"""

WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: shared}
spec:
  inputs:
    customer: {type: string, required: true}
  concurrency:
    - key: '"all"'
      limit: LIMIT
FAIR  initial_state: work
  states:
    work:
      actions: [{capability: fast}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""

CHUNK = 200
"""Runs started at once (each start is one append)."""


def manifest(limit: int, fair: bool) -> str:
    line = "      fair: inputs.customer\n" if fair else ""
    return WORKFLOW.replace("LIMIT", str(limit)).replace("FAIR", line)


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(a) - datetime.fromisoformat(b)).total_seconds()


@contextlib.asynccontextmanager
async def stack(url: str, limit: int, fair: bool) -> AsyncIterator[InterlockClient]:
    """A fresh prefix: the manifests applied, an orchestrator and a worker running."""
    subjects = Subjects(prefix=f"f{uuid.uuid4().hex[:10]}")
    opts = ConnectOptions.resolve(url, name="fairness bench")
    conns = [await connect(opts) for _ in range(3)]
    client = InterlockClient(conns[0], subjects)
    await client.ensure_provisioned()
    applied = await client.apply([("agent", AGENT), ("workflow", manifest(limit, fair))])
    assert applied.compiled.ok, applied.compiled.diagnostics
    orchestrator = Orchestrator(conns[1], subjects)
    await orchestrator.start()
    worker = Worker("fastagent", concurrency=64)

    @worker.capability("fast")
    async def fast(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return {}

    task = asyncio.create_task(worker.run(conns[2], prefix=subjects.prefix))
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        yield client
    finally:
        await worker.stop(force=True)
        await task
        await orchestrator.stop()
        for conn in conns:
            await conn.close()


async def start_many(client: InterlockClient, customer: str, count: int) -> list[str]:
    out: list[str] = []
    for first in range(0, count, CHUNK):
        n = min(CHUNK, count - first)
        out += await asyncio.gather(
            *(client.start("shared", {"customer": customer}) for _ in range(n))
        )
    return out


async def times_to_start(client: InterlockClient, run_ids: list[str]) -> list[float]:
    """Each run's seconds from run.started to run.admitted, once it has ended."""
    out = []
    for run_id in run_ids:
        await client.wait(run_id, 900)
        records = await client.read(run_id)
        admitted = next(r for r in records if isinstance(r, ev.RunAdmitted))
        out.append(seconds(admitted.time, records[0].time))
    return out


async def measure(url: str, flood: int, few: int, limit: int, fair: bool) -> tuple[float, float]:
    """B's median time to start alone, and beside A's flood (seconds)."""
    async with stack(url, limit, fair) as client:
        alone = statistics.median(await times_to_start(client, await start_many(client, "B", few)))
    async with stack(url, limit, fair) as client:
        flooding = await start_many(client, "A", flood)
        beside = await start_many(client, "B", few)
        crowded = statistics.median(await times_to_start(client, beside))
        for run_id in flooding:
            await client.wait(run_id, 900)
    return alone, crowded


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench fairness", description=__doc__.split("\n")[0])
    p.add_argument("--flood", type=int, default=5000, help="runs key A starts")
    p.add_argument("--few", type=int, default=50, help="runs key B starts")
    p.add_argument("--limit", type=int, default=10, help="slots shared by both keys")
    args = p.parse_args(argv)
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="interlock-fairness-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        server.start()
        try:
            rows = [
                (fair, asyncio.run(measure(server.url, args.flood, args.few, args.limit, fair)))
                for fair in (False, True)
            ]
        finally:
            server.stop()
    print(
        f"key B's median time to start, {args.few} runs beside key A's {args.flood}, "
        f"{args.limit} slots shared (load average {os.getloadavg()[0]:.1f}, "
        f"{time.time() - began:.0f} s)"
    )
    for fair, (alone, crowded) in rows:
        ratio = crowded / alone if alone > 0 else float("inf")
        goal = " (goal <= 2x: " + ("met" if ratio <= 2 else "NOT met") + ")" if fair else ""
        print(
            f"  fair share {'on ' if fair else 'off'}: alone {alone * 1000:8.1f} ms, "
            f"beside the flood {crowded * 1000:9.1f} ms, {ratio:7.1f}x{goal}"
        )
    return 0
