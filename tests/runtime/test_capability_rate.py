"""A capability's rate limit on a real nats-server, its clock simulated: with ``rate:
{limit: 60, per: 1m}`` a fast worker completes 600 requests in ten minutes (the 600th
dispatched 599 s after the first, none sooner), never more than 60 dispatched in any
minute; the line is woken by a timer when its next token is due."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from interlock.core import events as ev
from interlock.runtime.timers import ClockTimers, ManualClock
from interlock.sdk import TaskContext, Worker
from interlock.transport.directget import read_messages
from interlock.transport.subjects import Subjects
from support.concurrency import calling
from support.runtime import Stack, connect, eventually, running_stack, yaml

RATED_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: ratedagent
    spec:
      capabilities:
        - name: echo.rated
          rate: {limit: 60, per: 1m}
    """
)

RATED = calling("rated", "echo.rated")

COUNT = 600
START = "2026-01-01T00:00:00Z"


def seconds(at: str) -> float:
    return (datetime.fromisoformat(at) - datetime.fromisoformat(START)).total_seconds()


async def test_sixty_a_minute_completes_six_hundred_requests_in_ten_minutes(
    nats_url: str, subjects: Subjects
) -> None:
    clock = ManualClock(START)
    timers = ClockTimers(clock)
    manifests = [RATED_AGENT, RATED]
    async with running_stack(
        nats_url, subjects, manifests, worker=False, clock=clock, timers=timers
    ) as stack:
        worker = Worker("ratedagent", concurrency=64, grace_period=0.1)

        @worker.capability("echo.rated")
        async def rated(inp: dict[str, int], ctx: TaskContext) -> dict[str, int]:
            return inp

        nc = await connect(nats_url)
        task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
        slots = stack.orchestrator.flow.admission.slots
        try:
            for first in range(0, COUNT, 100):
                await asyncio.gather(
                    *(stack.client.start("rated", {"n": n}) for n in range(first, first + 100))
                )

            async def all_in_line() -> bool:
                entries = await slots.entries()
                return len(entries) == 1 and entries[0].queued == COUNT - 1

            await eventually(all_in_line, what="one request out, the rest in line", within=60)
            for _ in range(COUNT - 1):
                assert await timers.advance(1.0) == 1  # the line's wake-up, once a second
            assert clock() == "2026-01-01T00:09:59.000Z"

            async def none_waits() -> bool:
                entries = await slots.entries()
                return all(not e.queued for e in entries)

            await eventually(none_waits, what="every request dispatched")
            outcomes = await asyncio.gather(*(stack.client.wait(r, 60) for r in await _runs(stack)))
            assert len(outcomes) == COUNT
            assert {o.status for o in outcomes} == {"completed"}
        finally:
            await worker.stop(force=True)
            await task
            await nc.close()

        admitted: list[float] = []
        completed: list[float] = []
        for _, _, payload in await read_messages(
            stack.client.nc, subjects.runs_stream, subjects.runs_all
        ):
            for record in ev.decode_batch(payload):
                if isinstance(record, ev.ActionAdmitted):
                    admitted.append(seconds(record.time))
                elif isinstance(record, ev.ActionRequested) and record.data.admitted_at:
                    admitted.append(seconds(record.data.admitted_at))
                elif isinstance(record, ev.RunCompleted):
                    completed.append(seconds(record.time))
        admitted.sort()
        # One a second from the start: the 600th 599 s after the first, none sooner.
        assert admitted == [float(n) for n in range(COUNT)]
        assert len(completed) == COUNT
        assert 599 <= max(completed) <= 600  # ten minutes, give or take a second
        # No window of a minute holds more than 60 dispatches.
        for i in range(COUNT - 60):
            assert admitted[i + 60] - admitted[i] >= 60
        assert timers.pending == 0  # nothing left to wake


async def _runs(stack: Stack) -> list[str]:
    found: set[str] = set()
    for _, _, payload in await read_messages(
        stack.client.nc, stack.subjects.runs_stream, stack.subjects.runs_all
    ):
        for record in ev.decode_batch(payload):
            if isinstance(record, ev.RunStarted):
                found.add(record.subject)
    return sorted(found)


pytestmark = pytest.mark.timeout(240)
