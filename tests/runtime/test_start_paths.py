"""A run gets the same records however it is started: ``interlock start`` (a separate CLI
process that never saw the AgentDefs) and a trigger event routed by the orchestrator both
give the first state's actions, and a map's first items, their capability's defaults
(timeout and retries) and their timeout timers."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from interlock.core import events as ev
from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, cli_env, connect, run_cli, running_stack, yaml

TIMED_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: timedagent
    spec:
      capabilities:
        - name: timed
          timeout_seconds: 30
          max_retries: 2
    """
)

SINGLE = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: single
    spec:
      triggers:
        - event: com.example.single
      initial_state: first
      states:
        first:
          actions:
            - capability: timed
              input: {n: 0}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)

FANOUT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: fanout
    spec:
      inputs:
        xs: {type: list, default: [1, 2, 3]}
      triggers:
        - event: com.example.fanout
      initial_state: fan
      states:
        fan:
          map:
            over: inputs.xs
            as: x
            parallelism: 2
            action:
              capability: timed
              input: {n: "{{ x }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


def _shape(records: list[ev.AnyRecord]) -> list[tuple[Any, ...]]:
    """What must not depend on how the run was started: each record's type, and for
    requested actions and timers what was asked for (not ids or times)."""
    out: list[tuple[Any, ...]] = []
    for r in records:
        if isinstance(r, ev.ActionRequested):
            d = r.data
            retry = None if d.retry is None else msgspec.to_builtins(d.retry)
            out.append(
                (type(r).__name__, d.state, d.index, d.item, d.capability, d.timeout_s, retry)
            )
        else:
            out.append((type(r).__name__,))
    return out


def _cli(env: dict[str, str], *args: str) -> str:
    done = run_cli(*args, env=env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout.strip()


@pytest.mark.parametrize(("workflow", "manifest"), [("single", SINGLE), ("fanout", FANOUT)])
async def test_cli_started_and_trigger_started_runs_get_the_same_records(
    workflow: str, manifest: str, nats_url: str, subjects: Subjects
) -> None:
    worker = Worker("timedagent", concurrency=8)

    @worker.capability("timed")
    async def timed(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return inp

    async with running_stack(nats_url, subjects, [TIMED_AGENT, manifest], worker=False) as stack:
        wnc = await connect(nats_url)
        task = asyncio.create_task(worker.run(wnc, prefix=subjects.prefix))
        try:
            await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
            env = cli_env(nats_url, subjects.prefix)
            by_cli = await asyncio.to_thread(_cli, env, "start", workflow)
            await asyncio.to_thread(
                _cli, env, "emit", f"com.example.{workflow}", "--source", "test"
            )
            await stack.wait(by_cli)
            by_trigger = await _other_run(stack, by_cli)
            await stack.wait(by_trigger)
            cli_records = await stack.records(by_cli)
            trigger_records = await stack.records(by_trigger)
        finally:
            await asyncio.wait_for(worker.stop(force=True), TIMEOUT)
            await task
            await wnc.close()
    requested = [r for r in cli_records if isinstance(r, ev.ActionRequested)]
    assert requested
    assert all(r.data.timeout_s == 30 for r in requested), requested
    assert all(r.data.retry is not None and r.data.retry.max_attempts == 3 for r in requested)
    timers = [r for r in cli_records if isinstance(r, ev.TimerScheduled)]
    assert len(timers) >= len(requested)  # one timeout timer per attempt at least
    assert _shape(cli_records) == _shape(trigger_records)


async def _other_run(stack: Any, known: str) -> str:
    """The run the trigger started (the only other run of this installation)."""

    async def probe() -> str | None:
        info = await stack.js.stream_info(stack.subjects.runs_stream, subjects_filter=">")
        runs = {s.rsplit(".", 1)[1] for s in (info.state.subjects or {})}
        others = runs - {known}
        return others.pop() if others else None

    for _ in range(int(TIMEOUT / 0.05)):
        found = await probe()
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("the trigger started no run")
