"""Control flow end to end on a real nats-server, with time on an advanceable clock.

The orchestrator runs in-process with :class:`ClockTimers`: timers are durable records in
the log like always, but they come due when the test advances the clock, so a one-hour
wait is tested in milliseconds. Agents are real SDK workers on their own connections.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.correlation import CorrelationIndex
from interlock.runtime.flow import child_run_id
from interlock.runtime.timers import ClockTimers
from interlock.sdk import AgentError, RetryableError, TaskContext, Worker
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.flow import WAIT, ClockStack, clock_orchestrator

REPO = Path(__file__).resolve().parents[2]


class Stack(ClockStack):
    def __init__(self, client: InterlockClient, timers: ClockTimers, fetch: dict[str, Any]):
        super().__init__(client, timers)
        self.fetch = fetch


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    async with clock_orchestrator(nats_url, subjects) as (client, timers, _):
        applied = await client.apply(
            [
                (str(p), p.read_text())
                for p in (
                    REPO / "examples" / "ingest.yaml",
                    REPO / "examples" / "ingest-agents.yaml",
                    REPO / "agents" / "interlock_agents" / "manifests" / "echo.yaml",
                )
            ]
        )
        assert applied.compiled.ok, applied.compiled.diagnostics
        fetch: dict[str, Any] = {"mode": "ok", "calls": Counter()}
        worker = Worker("flow-agent", concurrency=16, heartbeat_interval=60)

        @worker.capability("fetch")
        async def do_fetch(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            fetch["calls"][ctx.action_id] += 1
            mode = fetch["mode"]
            if mode == "flaky" and fetch["calls"][ctx.action_id] == 1:
                raise RetryableError("upstream busy")
            if mode == "broken":
                raise AgentError("no such source")
            if mode == "hang":
                await asyncio.sleep(3600)
            return {"rows": 3}

        @worker.capability("echo")
        async def echo(inp: dict[str, Any]) -> dict[str, Any]:
            return inp

        task = asyncio.create_task(worker.run(nats_url, prefix=subjects.prefix))
        try:
            yield Stack(client, timers, fetch)
        finally:
            await worker.stop(force=True)
            await asyncio.wait_for(task, WAIT)


def types(records: list[ev.AnyRecord]) -> list[str]:
    return [ev.record_type(r).removeprefix(ev.PREFIX) for r in records]


async def close_ticket(stack: Stack, ticket: str, event_id: str = "close-1") -> int:
    """Publish the ticket's close event; returns its sequence in the events stream."""
    return await stack.emit(
        CloudEvent(
            id=event_id,
            source="ops://tickets",
            type="ops.ticket.closed",
            time=utc_now(),
            datacontenttype="application/json",
            data={"ticket": ticket},
        )
    )


async def test_the_ingest_manifest_runs_end_to_end(stack: Stack) -> None:
    run_id = await stack.client.start("ingest", {"regions": ["eu", "us", "ap"], "ticket": "T-7"})
    waiting = await stack.run_until(run_id, lambda s: s.state == "wait_close", "to wait_close")
    assert waiting.states["shards"]["output"] == [
        {"region": "eu"},
        {"region": "us"},
        {"region": "ap"},
    ]
    # No run id: the ticket number reaches the run through the correlation index.
    await close_ticket(stack, "T-7")
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {
        "regions": [{"region": "eu"}, {"region": "us"}, {"region": "ap"}],
        "status": "ok",
    }
    records = await stack.records(run_id)
    started = [r for r in records if isinstance(r, ev.MapStarted)]
    assert started[0].data.items == ["eu", "us", "ap"]
    # A finished run leaves the correlation index.
    index = CorrelationIndex(stack.client.nc, stack.client.subjects)
    for _ in range(600):
        if not await index.runs("default", "ingest", "T-7"):
            break
        await asyncio.sleep(0.05)
    assert await index.runs("default", "ingest", "T-7") == []
    # parallelism 2: never more than two items in flight.
    in_flight = peak = 0
    for r in records:
        if isinstance(r, ev.ActionRequested) and r.data.item is not None:
            in_flight += 1
            peak = max(peak, in_flight)
        if isinstance(r, ev.ActionCompleted) and r.data.item is not None:
            in_flight -= 1
    assert peak == 2


async def test_a_retryable_failure_is_retried_after_a_durable_backoff(stack: Stack) -> None:
    stack.fetch["mode"] = "flaky"
    run_id = await stack.client.start("ingest", {"regions": ["eu"]})
    await stack.run_until(run_id, lambda s: bool(s.timers) and not s.pending, "a retry timer")
    records = await stack.records(run_id)
    failed = [r for r in records if isinstance(r, ev.ActionFailed)]
    assert failed[0].data.will_retry
    assert failed[0].data.error.error_class == "agent_error"
    timer = next(
        r for r in records if isinstance(r, ev.TimerScheduled) and r.data.purpose == "retry"
    )
    assert timer.data.attempt == 2
    # Nothing happens until the backoff (at most 100 ms) has passed.
    await stack.advance(run_id, 0.01)
    assert (await stack.client.state(run_id)).timers
    await stack.advance(run_id, 0.2)
    state = await stack.run_until(run_id, lambda s: s.state == "wait_close", "past fetch")
    assert state.states["fetch"]["output"] == {"rows": 3}
    requested = [
        r
        for r in await stack.records(run_id)
        if isinstance(r, ev.ActionRequested) and r.data.state == "fetch"
    ]
    assert [r.data.attempt for r in requested] == [1, 2]
    assert len({r.data.action_id for r in requested}) == 1


async def test_a_non_retryable_failure_is_caught(stack: Stack) -> None:
    stack.fetch["mode"] = "broken"
    run_id = await stack.client.start("ingest", {"regions": ["eu"]})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"status": "failed-over"}
    fired = [r for r in await stack.records(run_id) if isinstance(r, ev.TransitionFired)]
    assert (fired[-1].data.from_state, fired[-1].data.event_type) == ("fetch", "task.failed")


async def test_an_action_that_never_answers_times_out_retries_then_is_caught(
    stack: Stack,
) -> None:
    stack.fetch["mode"] = "hang"
    run_id = await stack.client.start("ingest", {"regions": ["eu"]})
    for attempt in (1, 2, 3):
        await stack.run_until(
            run_id,
            lambda s, a=attempt: any(p.attempt == a for p in s.pending.values()),
            f"attempt {attempt} in flight",
        )
        await stack.advance(run_id, 2.0)  # the action's timeout
        if attempt < 3:
            await stack.advance(run_id, 1.0)  # the backoff
    state = await stack.finished(run_id)
    assert state.outputs == {"status": "failed-over"}
    records = await stack.records(run_id)
    failures = [r.data for r in records if isinstance(r, ev.ActionFailed)]
    assert [(f.attempt, f.error.error_class, f.will_retry) for f in failures] == [
        (1, "timeout", True),
        (2, "timeout", True),
        (3, "timeout", False),
    ]


async def test_a_state_timeout_fires_once_after_its_wait(stack: Stack) -> None:
    run_id = await stack.client.start("ingest", {"regions": ["eu"], "ticket": "T-9"})
    await stack.run_until(run_id, lambda s: s.state == "wait_close", "to wait_close")
    await stack.advance(run_id, 59 * 60)
    assert (await stack.client.state(run_id)).state == "wait_close"
    await stack.advance(run_id, 61)
    state = await stack.finished(run_id)
    assert state.outputs == {"status": "failed-over"}
    records = await stack.records(run_id)
    assert types(records).count("timer.fired") == 1
    # A close event that comes too late changes nothing.
    await stack.ingested(await close_ticket(stack, "T-9", "late"))
    assert len(await stack.records(run_id)) == len(records)


async def test_an_event_that_arrives_before_its_run_waits_is_kept_and_delivered(
    stack: Stack,
) -> None:
    stack.fetch["mode"] = "flaky"  # holds the run in fetch until the clock moves
    run_id = await stack.client.start("ingest", {"regions": ["eu"], "ticket": "T-early"})
    await stack.run_until(run_id, lambda s: bool(s.timers) and not s.pending, "a retry timer")
    await stack.ingested(await close_ticket(stack, "T-early", "early-close"))
    assert (await stack.client.state(run_id)).state == "fetch"  # kept for later, not taken
    await stack.advance(run_id, 0.2)
    state = await stack.finished(run_id)
    assert state.outputs is not None
    assert state.outputs["status"] == "ok"


async def test_the_map_fan_out_budget_fails_the_state(stack: Stack) -> None:
    regions = [f"r{i}" for i in range(17)]  # budget.max_fan_out is 16
    run_id = await stack.client.start("ingest", {"regions": regions})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"


async def test_cancel_stops_a_run_and_its_timers(stack: Stack) -> None:
    run_id = await stack.client.start("ingest", {"regions": ["eu"], "ticket": "T-c"})
    await stack.run_until(run_id, lambda s: s.state == "wait_close", "to wait_close")
    assert await stack.client.cancel(run_id)
    await stack.advance(run_id, 3600)
    state = await stack.client.state(run_id)
    assert state.status == "cancelled"
    assert "timer.fired" not in types(await stack.records(run_id))


async def test_a_sub_workflow_runs_as_a_child_and_binds_its_outputs(stack: Stack) -> None:
    sub = REPO / "examples" / "subworkflow.yaml"
    assert (await stack.client.apply([(str(sub), sub.read_text())])).compiled.ok
    run_id = await stack.client.start("greet-parent", {"who": "ada"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"greeting": "hello ada"}
    requested = next(r for r in await stack.records(run_id) if isinstance(r, ev.ActionRequested))
    assert requested.data.workflow == "greet-child"
    child = child_run_id(requested.data.action_id, 1)
    child_state = await stack.client.state(child)
    assert child_state.status == "completed"
    assert child_state.parent is not None
    assert child_state.parent.run_id == run_id


async def test_cancelling_the_parent_cancels_the_child(stack: Stack) -> None:
    child_wf = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: slow-child}
spec:
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: slow-parent}
spec:
  initial_state: call
  states:
    call:
      actions: [{workflow: slow-child}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    assert (await stack.client.apply([("slow.yaml", child_wf)])).compiled.ok
    run_id = await stack.client.start("slow-parent", {})
    parent = await stack.run_until(run_id, lambda s: bool(s.pending), "its child action")
    (action_id,) = parent.pending
    child = child_run_id(action_id, 1)
    await stack.run_until(child, lambda s: s.state == "wait", "the child waiting")
    assert await stack.client.cancel(run_id)
    child_state = await stack.run_until(child, lambda s: s.finished, "the child cancelled")
    assert child_state.status == "cancelled"


async def test_a_child_workflow_is_looked_up_in_the_parents_namespace(stack: Stack) -> None:
    # Two workflows named `leaf`: one in `default`, one in `team`. A `team` parent naming
    # `leaf` gets its own namespace's; `default/leaf` names the other one.
    manifests = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: leaf}
spec:
  initial_state: done
  states:
    done: {type: terminal, outputs: {where: default}}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: leaf, namespace: team}
spec:
  initial_state: done
  states:
    done: {type: terminal, outputs: {where: team}}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: caller, namespace: team}
spec:
  initial_state: own
  states:
    own:
      actions: [{workflow: leaf}]
      on: [{event: task.completed, goto: other, set: {own: "{{ result.where }}"}}]
    other:
      actions: [{workflow: default/leaf}]
      on: [{event: task.completed, goto: done, set: {other: "{{ result.where }}"}}]
    done:
      type: terminal
      outputs: {own: "{{ context.own }}", other: "{{ context.other }}"}
"""
    assert (await stack.client.apply([("ns.yaml", manifests)])).compiled.ok
    run_id = await stack.client.start("team/caller", {})
    state = await stack.finished(run_id)
    assert state.status == "completed", state.error
    assert state.outputs == {"own": "team", "other": "default"}
