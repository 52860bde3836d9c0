"""kill -9 of the orchestrator while control flow is pending, then a restart.

The orchestrator runs as ``python -m interlock serve`` in a child process, with the real
JetStream timers (message scheduling), and is killed with SIGKILL while retry backoffs are
waiting and while map items are in flight at a slow agent. After the restart every run
completes exactly once, every attempt is dispatched once and every map item is answered
once: the schedules lived in the server, the answers in the RESULTS stream, and the relay
re-does only what the log says is left, under deterministic message ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import nats
import pytest
from nats.js.errors import NotFoundError

from interlock.core import events as ev
from interlock.core.state import RunState
from interlock.runtime.client import InterlockClient
from interlock.sdk import RetryableError, TaskContext, Worker
from interlock.transport.subjects import Subjects

WAIT = 30.0

MANIFESTS = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata: {name: crash-agent}
    spec:
      capabilities:
        - {name: crash.flaky, input_schema: {type: object}, output_schema: {type: object}}
        - {name: crash.slow, input_schema: {type: object}, output_schema: {type: object}}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: crash-retry}
    spec:
      initial_state: call
      states:
        call:
          actions:
            - capability: crash.flaky
              retry:
                max_attempts: 3
                backoff: {initial: 5s, multiplier: 1, max: 5s, jitter: false}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs: {attempt: "$.states.call.output.attempt"}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: crash-map}
    spec:
      inputs:
        items: {type: "list[string]", required: true}
      initial_state: fan
      states:
        fan:
          map:
            over: inputs.items
            as: item
            parallelism: 3
            action: {capability: crash.slow, input: {item: "{{ item }}"}}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs: {items: "$.states.fan.output"}
    """
)


class Orchestrator:
    """``python -m interlock serve`` in a child process, as an operator runs it."""

    def __init__(self, url: str, prefix: str) -> None:
        argv = [sys.executable, "-m", "interlock", "serve", "--server", url, "--prefix", prefix]
        # A short ack wait: records the killed process had taken come back within 2 s.
        argv += ["--ack-wait", "2", "--metrics-port", "0"]
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _wait_for(self, pattern: str) -> None:
        deadline = time.monotonic() + WAIT
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"the orchestrator exited: {self.output}")
            self.lines.append(line)
            if re.search(pattern, line):
                return
        raise AssertionError(f"the orchestrator never said {pattern!r}: {self.output}")

    async def started(self) -> None:
        await asyncio.to_thread(self._wait_for, "orchestrator started")

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-30:])

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT)


class Agent:
    """``crash.flaky`` fails its first attempt; ``crash.slow`` waits for ``release``."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, int]] = Counter()
        """(action id, attempt) -> how often a handler ran for it."""
        self.release = asyncio.Event()
        self.worker = Worker("crash-agent", concurrency=16, heartbeat_interval=60)

        @self.worker.capability("crash.flaky")
        async def flaky(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            self.calls[(ctx.action_id, ctx.attempt)] += 1
            if ctx.attempt == 1:
                raise RetryableError("not yet")
            return {"attempt": ctx.attempt}

        @self.worker.capability("crash.slow")
        async def slow(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            self.calls[(ctx.action_id, ctx.attempt)] += 1
            await self.release.wait()
            return {"item": inp["item"]}


@pytest.fixture
async def setup(nats_url: str, subjects: Subjects) -> AsyncIterator[tuple[InterlockClient, Agent]]:
    nc = await nats.connect(nats_url)
    client = InterlockClient(nc, subjects)
    await client.ensure_provisioned()
    applied = await client.apply([("crash.yaml", MANIFESTS)])
    assert applied.compiled.ok, applied.compiled.diagnostics
    agent = Agent()
    task = asyncio.create_task(agent.worker.run(nats_url, prefix=subjects.prefix))
    try:
        await asyncio.wait_for(agent.worker.wait_ready(), WAIT)
        yield client, agent
    finally:
        await agent.worker.stop(force=True)
        await asyncio.wait_for(task, WAIT)
        await nc.close()


async def until(
    client: InterlockClient, run_id: str, predicate: Callable[[RunState], bool], what: str
) -> RunState:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        state = await client.state(run_id)
        if predicate(state):
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never got {what}")


def kinds(records: list[ev.AnyRecord]) -> Counter[str]:
    return Counter(ev.record_type(r).removeprefix(ev.PREFIX) for r in records)


def seconds_until(moment: str) -> float:
    at = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return at.timestamp() - time.time()


async def test_a_retry_backoff_survives_a_kill_and_fires_once(
    nats_url: str, subjects: Subjects, setup: tuple[InterlockClient, Agent]
) -> None:
    client, agent = setup
    orchestrator = Orchestrator(nats_url, subjects.prefix)
    try:
        await orchestrator.started()
        run_ids = [await client.start("crash-retry", {}) for _ in range(3)]
        timers: list[ev.TimerScheduledData] = []
        for run_id in run_ids:
            state = await until(
                client, run_id, lambda s: bool(s.timers) and not s.pending, "a retry timer"
            )
            [timer] = state.timers.values()
            assert timer.purpose == "retry"
            timers.append(timer)
        # Each backoff is a schedule in the server by now, not a sleep in the process. (5 s:
        # the three runs' timers are looked at, and the process killed, before any fires,
        # which on a loaded machine took more than the 2 s it was.)
        for timer in timers:

            async def scheduled(timer_id: str = timer.timer_id) -> bool:
                with contextlib.suppress(NotFoundError):
                    await client.js.get_last_msg(
                        subjects.timers_stream, subjects.timer_schedule(timer_id)
                    )
                    return True
                return False

            deadline = time.monotonic() + WAIT
            while not await scheduled():
                assert time.monotonic() < deadline, f"timer {timer.timer_id} never scheduled"
                await asyncio.sleep(0.05)

        orchestrator.kill()
        # The backoffs come due while no orchestrator runs: the server stores each fired
        # timer on the run's subject of the timers stream.
        for run_id in run_ids:

            async def fired(run_id: str = run_id) -> bool:
                with contextlib.suppress(NotFoundError):
                    await client.js.get_last_msg(
                        subjects.timers_stream, subjects.timer_fired(run_id)
                    )
                    return True
                return False

            deadline = time.monotonic() + WAIT + max(seconds_until(t.fire_at) for t in timers)
            while not await fired():
                assert time.monotonic() < deadline, f"the timer of {run_id} never fired"
                await asyncio.sleep(0.05)
        orchestrator = Orchestrator(nats_url, subjects.prefix)
        await orchestrator.started()
        states = [await client.wait(r, WAIT) for r in run_ids]
    finally:
        orchestrator.kill()

    assert [s.outputs for s in states] == [{"attempt": 2}] * 3
    for run_id in run_ids:
        records = await client.read(run_id)
        counted = kinds(records)
        assert counted["run.completed"] == 1
        assert counted["timer.fired"] == 1
        requested = [r.data for r in records if isinstance(r, ev.ActionRequested)]
        assert [r.attempt for r in requested] == [1, 2]
        for r in requested:
            assert agent.calls[(r.action_id, r.attempt)] == 1, "an attempt was handled twice"
    assert agent.calls.total() == 6


async def test_a_map_fan_out_survives_a_kill_and_answers_each_item_once(
    nats_url: str, subjects: Subjects, setup: tuple[InterlockClient, Agent]
) -> None:
    client, agent = setup
    items = ["a", "b", "c", "d", "e"]
    orchestrator = Orchestrator(nats_url, subjects.prefix)
    try:
        await orchestrator.started()
        run_id = await client.start("crash-map", {"items": items})
        deadline = time.monotonic() + WAIT
        while agent.calls.total() < 3:  # parallelism 3: three items at the agent
            assert time.monotonic() < deadline, "the items never reached the agent"
            await asyncio.sleep(0.05)
        orchestrator.kill()
        # The agent answers while no orchestrator runs: the answers wait in RESULTS.
        agent.release.set()
        deadline = time.monotonic() + WAIT
        while (await client.js.stream_info(subjects.results_stream)).state.messages < 3:
            assert time.monotonic() < deadline, "the agent's answers never reached RESULTS"
            await asyncio.sleep(0.05)
        assert (await client.state(run_id)).status == "running"
        orchestrator = Orchestrator(nats_url, subjects.prefix)
        await orchestrator.started()
        state = await client.wait(run_id, WAIT)
    finally:
        orchestrator.kill()

    assert state.outputs == {"items": [{"item": i} for i in items]}
    records = await client.read(run_id)
    counted = kinds(records)
    assert counted["run.completed"] == 1
    assert counted["map.completed"] == 1
    requested = [r.data for r in records if isinstance(r, ev.ActionRequested)]
    assert sorted(r.item for r in requested if r.item is not None) == list(range(len(items)))
    completed = [r.data.item for r in records if isinstance(r, ev.ActionCompleted)]
    assert sorted(i for i in completed if i is not None) == list(range(len(items)))
    for r in requested:
        assert agent.calls[(r.action_id, r.attempt)] == 1, f"item {r.item} answered twice"
    assert agent.calls.total() == len(items)
