"""Costly guards and everyone else: how much a workflow whose guard costs its whole step
budget slows the runs of another workflow.

Against one fresh embedded nats-server, with the orchestrator and the reference agents in
this process (as ``interlock dev`` runs them), it measures the latency of ``bystander``
runs (an ``echo`` action, started with ``start``, timed to their completion) one after
another, twice in the same run:

1. ``quiet``: nothing else going on (the baseline);
2. ``costly decisions going on``: while a ``looping`` run is fed ``go`` events without
   pause, each costing its guard the whole step budget, decided the way the orchestrator
   does (a workflow with a comprehension on a thread of its own).

It prints p50 and p99 of each, each as a multiple of the quiet p50, how many costly
decisions were made meanwhile, and what one costs alone (the CPU time of one evaluation
that spends the budget): decided on the event loop, as before, every run in flight would
stop for that long at each of them.

    python -m bench guard [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.raw_nats import percentile
from interlock.cli.dev import start_stack, stop_stack
from interlock.core import events as ev
from interlock.core.expr import Expression, ExpressionError
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.cloudevents import CloudEvent

MANIFESTS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: bystander
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          input: {message: hi}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
---
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: looping
spec:
  inputs:
    xs: {type: list, required: true}
  initial_state: check
  states:
    check:
      type: human_in_the_loop
      on:
        - event: go
          guard: 'inputs.xs.all(x, x >= 0)'
          goto: done
    done:
      type: terminal
"""


async def _latencies(client: InterlockClient, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        run_id = await client.start("bystander", {})
        state = await client.wait(run_id, 120)
        assert state.status == "completed", state
        out.append(time.perf_counter() - started)
    return out


async def _feed(client: InterlockClient, run_id: str, stop: asyncio.Event) -> None:
    """``go`` events to the costly run, a few ahead of its decisions, until ``stop``."""
    n = 0
    while not stop.is_set():
        for _ in range(4):
            event = CloudEvent(
                id=f"{run_id}-go-{n}", source="bench", type="go", extensions={"runid": run_id}
            )
            await client.emit(event)
            n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def _phase(client: InterlockClient, runs: int, *, costly: bool) -> list[float]:
    if not costly:
        return await _latencies(client, runs)
    run_id = await client.start("looping", {"xs": list(range(20_000))})
    stop = asyncio.Event()
    feeder = asyncio.create_task(_feed(client, run_id, stop))
    try:
        await asyncio.sleep(1.0)  # costly decisions under way
        before = await _costly_decisions(client, run_id)
        latencies = await _latencies(client, runs)
        decided = await _costly_decisions(client, run_id) - before
        print(f"  {decided} costly decisions while {runs} bystander runs ran", flush=True)
        return latencies
    finally:
        stop.set()
        await feeder
        await client.cancel(run_id, "bench over")


async def _costly_decisions(client: InterlockClient, run_id: str) -> int:
    return sum(isinstance(r, ev.GuardFailed) for r in await client.read(run_id))


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="interlock-bench-") as tmp:
        server = EmbeddedNats(Path(tmp))
        server.start()
        try:
            stack = await start_stack(server.url)
            client = InterlockClient(stack[3], stack[0].subjects)
            try:
                applied = await client.apply([("<bench>", MANIFESTS)])
                applied.compiled.raise_for_errors()
                await _latencies(client, 3)  # warm up
                results["quiet"] = await _phase(client, args.runs, costly=False)
                results["costly decisions going on"] = await _phase(client, args.runs, costly=True)
            finally:
                await stop_stack(*stack)
        finally:
            server.stop()
    return results


def table(results: dict[str, list[float]]) -> str:
    base = statistics.median(results["quiet"])
    lines = [f"{'bystander run latency':<24} {'p50 ms':>9} {'p99 ms':>9} {'p50 / quiet':>12}"]
    for name, values in results.items():
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        lines.append(f"{name:<24} {p50 * 1e3:9.1f} {p99 * 1e3:9.1f} {p50 / base:12.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench guard", description=__doc__)
    p.add_argument("--runs", type=int, default=20, help="bystander runs per phase")
    args = p.parse_args(argv)
    results: dict[str, Any] = asyncio.run(run(args))
    print(table(results))
    expression = Expression("inputs.xs.all(x, x >= 0)")
    started = time.process_time()
    with contextlib.suppress(ExpressionError):
        expression.evaluate({"inputs": {"xs": list(range(20_000))}})
    print(f"one costly decision alone: {(time.process_time() - started) * 1e3:.0f} ms of CPU")
    return 0
