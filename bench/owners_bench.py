"""Owners: what deciding a run's messages on the replica that holds its partition saves.

Three orchestrator replicas (in this one process) over six partitions, and runs that each
take an answer on the results stream (the worker never answers by request), a signal
(``<prefix>.events.@run.<run>.go``), a state's timer, then four answers at once (a map
of four items): the three kinds of message that come through the shared ``results``,
``ingress`` and ``timers`` consumers, one after the other and together. Two passes on
one nats-server, each under a prefix of its own: ``shared`` (every replica decides what it
reads, as before the handover) and ``owner`` (a message for a run of another replica's
partition is handed to that replica). For each: runs/s, and per run the appends that lost
the optimistic race (conflicts), the run states read from the log rather than the cache
(misses), and the messages handed over.

    python -m bench owners                 # 300 runs a pass
    python -m bench owners --runs 100 --replicas 3 --partitions 6
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.runs import Entry, Runs
from interlock.runtime.service import Orchestrator
from interlock.sdk import TaskContext, Worker
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects

AGENT = """
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: owners-bench}
spec:
  capabilities:
    - {name: echo, input_schema: {type: object}, output_schema: {type: object}}
"""
WORKFLOW = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: owned}
spec:
  initial_state: ask
  states:
    ask:
      actions: [{capability: echo, input: {step: 1}}]
      on: [{event: task.completed, goto: wait}]
    wait:
      type: human_in_the_loop
      on: [{event: go, goto: nap}]
    nap:
      type: human_in_the_loop
      timeout: {after: 100ms, goto: fan}
    fan:
      map:
        over: "[1, 2, 3, 4]"
        as: n
        parallelism: 4
        completion: all
        action: {capability: echo, input: {n: "{{ n }}"}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal, outputs: {ok: true}}
"""


@dataclass
class Pass:
    mode: str
    runs: int = 0
    seconds: float = 0.0
    conflicts: int = 0
    misses: int = 0
    handed: int = 0


def _count_misses(runs: Runs, tally: list[int]) -> None:
    """Count the loads that read the run's log (not in the cache)."""
    load = runs.load

    async def counting(run_id: str, *, fresh: bool = False) -> Entry | None:
        if fresh or runs.cached(run_id) is None:
            tally[0] += 1
        return await load(run_id, fresh=fresh)

    runs.load = counting  # type: ignore[method-assign]


async def _never(*_: Any) -> bool:
    return False


async def _pass(url: str, mode: str, args: argparse.Namespace) -> Pass:
    subjects = Subjects(f"ob{uuid.uuid4().hex[:8]}")
    client = InterlockClient(await nats.connect(url), subjects)
    await provision(client.js, subjects, partitions=args.partitions)
    result = await client.apply([("agent.yaml", AGENT), ("owned.yaml", WORKFLOW)])
    assert result.compiled.ok, [str(d) for d in result.compiled.diagnostics]
    tally = [0]
    replicas = []
    for _ in range(args.replicas):
        orchestrator = Orchestrator(await nats.connect(url), subjects, partitions=args.partitions)
        if mode == "shared":
            orchestrator.owners.handover.hand = _never  # type: ignore[method-assign]
        _count_misses(orchestrator.runs, tally)
        await orchestrator.start()
        replicas.append(orchestrator)
    worker = Worker("owners-bench", concurrency=64, answer_timeout=0)

    @worker.capability("echo")
    async def echo(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return inp

    worker_nc = await nats.connect(url)
    running = asyncio.create_task(worker.run(worker_nc, prefix=subjects.prefix))
    await worker.wait_ready()
    try:
        while not all(len(o.relay.ownership.held) for o in replicas):  # noqa: ASYNC110
            await asyncio.sleep(0.25)
        await asyncio.sleep(2 * 2.0)  # two rounds: the shares settle
        gate = asyncio.Semaphore(args.in_flight)

        async def one(i: int) -> None:
            async with gate:
                run_id = await client.start("owned", {})
                while (await client.state(run_id)).state != "wait":  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
                go = CloudEvent(
                    id=f"go-{i}",
                    source="bench://owners",
                    type="go",
                    time=utc_now(),
                    extensions={"runid": run_id},
                )
                await client.emit(go)
                await client.wait(run_id, 120)

        began = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.runs)))
        took = time.perf_counter() - began
        return Pass(
            mode,
            args.runs,
            took,
            sum(o.runs.conflicts for o in replicas),
            tally[0],
            sum(o.counters["handovers_handed"] for o in replicas),
        )
    finally:
        await worker.stop(force=True)
        await running
        for orchestrator in replicas:
            await orchestrator.stop()
            await orchestrator.nc.close()
        await worker_nc.close()
        await client.nc.close()


async def _main(args: argparse.Namespace) -> list[Pass]:
    with tempfile.TemporaryDirectory(prefix="owners-bench-") as work:
        server = EmbeddedNats(Path(work) / "data")
        server.start()
        try:
            return [await _pass(server.url, mode, args) for mode in ("shared", "owner")]
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench owners", description=__doc__)
    parser.add_argument("--runs", type=int, default=300, help="runs a pass (default 300)")
    parser.add_argument("--in-flight", type=int, default=50, help="runs under way at once")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args(argv)
    passes = asyncio.run(_main(args))
    print(f"{args.replicas} replicas, {args.partitions} partitions, {args.runs} runs a pass")
    print(f"{'pass':8} {'runs/s':>8} {'conflicts/run':>14} {'misses/run':>11} {'handed/run':>11}")
    for p in passes:
        n = max(1, p.runs)
        print(
            f"{p.mode:8} {p.runs / p.seconds:8.1f} {p.conflicts / n:14.3f} "
            f"{p.misses / n:11.3f} {p.handed / n:11.3f}"
        )
    return 0
