"""A cancelled run's task requests leave the queue: a capability no worker serves shows
no queued task and no action in flight for runs that no longer want them (so
``InterlockCapabilityWithoutWorker`` does not fire for it)."""

from __future__ import annotations

import asyncio
from typing import Any

from test_metrics import samples, value

from interlock.client import Client
from interlock.core import events as ev
from interlock.runtime.taskqueue import TaskQueue
from interlock.transport import tasks
from interlock.transport.subjects import Subjects
from support.observability import TIMEOUT, http_get, instrumented_stack


async def until(probe: Any, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:
        got = await probe()
        if got is not None:
            return got
        if loop.time() > deadline:
            raise AssertionError(what)
        await asyncio.sleep(0.1)


async def test_cancelled_runs_leave_no_queued_tasks(nats_url: str, subjects: Subjects) -> None:
    async with instrumented_stack(nats_url, subjects, port=0) as stack:
        assert stack.telemetry.server is not None
        port = stack.telemetry.server.port
        client = Client(stack.client.nc, subjects)
        runs = [await stack.client.start("stuck", {}) for _ in range(2)]

        async def shown(queued: int) -> tuple[float, int | None] | None:
            _, body = await http_get(port, "/metrics")
            in_flight = value(samples(body)[1], "interlock_actions_in_flight", capability="nobody")
            (agent,) = [a for a in await client.agents() if a.name == "obsagent"]
            (cap,) = [c for c in agent.capabilities if c.name == "nobody"]
            return (in_flight, cap.queued) if in_flight == cap.queued == queued else None

        await until(lambda: shown(2), "the two runs' tasks were never queued")
        for run_id in runs:
            assert await client.cancel(run_id, "not wanted")
        await until(lambda: shown(0), "cancelled runs' tasks stayed queued")

        # A request dispatched before a restart (no sequence known): found in the queue.
        third = await stack.client.start("stuck", {})
        await until(lambda: shown(1), "the third run's task was never queued")
        (requested,) = [
            r for r in await stack.client.read(third) if isinstance(r, ev.ActionRequested)
        ]
        # Its next attempt queued beside it (a retry dispatched as the first timed out):
        # taking the timed-out attempt out leaves the retry queued.
        d = requested.data
        headers, payload = tasks.encode_request(
            run_id=third,
            action_id=d.action_id,
            capability="nobody",
            attempt=d.attempt + 1,
            data={},
            time=requested.time,
            deadline=None,
            traceparent=None,
            token="t",
        )
        await stack.client.js.publish(subjects.capability("nobody"), payload, headers=headers)
        fresh = TaskQueue(stack.client.js, subjects)
        assert await fresh.remove("nobody", {d.action_id: d.attempt}, exact=True) == 1
        assert await fresh.remove("nobody", {d.action_id: d.attempt}, exact=True) == 0
        assert await fresh.remove("nobody", {d.action_id: None}) == 1  # cancelled: every one
        await until(lambda: shown(0), "the third run's task stayed queued")


APPROVAL = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: approving}
spec:
  initial_state: approval
  states:
    approval:
      type: human_in_the_loop
      on:
        - {event: approval.granted, goto: done}
    done:
      type: terminal
"""


async def test_a_run_waiting_for_a_person_is_not_counted_as_stuck_work(
    nats_url: str, subjects: Subjects
) -> None:
    async with instrumented_stack(nats_url, subjects, port=0) as stack:
        assert stack.telemetry.server is not None
        port = stack.telemetry.server.port
        applied = await stack.client.apply([("approving.yaml", APPROVAL)])
        assert applied.compiled.ok
        await stack.client.start("approving", {})
        await stack.client.start("stuck", {})

        async def labelled() -> dict[str, str] | None:
            _, body = await http_get(port, "/metrics")
            waits = {
                dict(labels)["workflow"]: dict(labels).get("waits", "")
                for (name, labels) in samples(body)[1]
                if name == "interlock_runs_state_age_max_seconds"
            }
            return waits if {"approving", "stuck"} <= set(waits) else None

        waits = await until(labelled, "the runs never showed in the gauge")
        assert waits["approving"] == "event"
        assert waits["stuck"] == "work"
