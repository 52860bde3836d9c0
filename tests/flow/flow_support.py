"""Shared by the control-flow tests: an in-process orchestrator whose timers run on a
:class:`ManualClock`, so waits of hours come due when a test advances the clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import nats

from interlock.core import events as ev
from interlock.core.state import RunState
from interlock.runtime.client import InterlockClient
from interlock.runtime.runs import UnknownRun, utc_now
from interlock.runtime.service import Orchestrator
from interlock.runtime.subjects import Subjects
from interlock.runtime.timers import ClockTimers, ManualClock

WAIT = 10.0


@contextlib.asynccontextmanager
async def clock_orchestrator(
    nats_url: str, subjects: Subjects
) -> AsyncIterator[tuple[InterlockClient, ClockTimers, Orchestrator]]:
    """An orchestrator and a client (each on its own connection) that share one manual clock."""
    clock = ManualClock(utc_now())
    timers = ClockTimers(clock)
    nc_o = await nats.connect(nats_url)
    nc_c = await nats.connect(nats_url)
    orchestrator = Orchestrator(nc_o, subjects, clock=clock, timers=timers)
    await orchestrator.start()
    client = InterlockClient(nc_c, subjects)
    client.runs.clock = clock  # runs started by the client are timed by the same clock
    try:
        yield client, timers, orchestrator
    finally:
        await orchestrator.stop()
        await nc_o.close()
        await nc_c.close()


class ClockStack:
    """Waits on runs in real time (bounded) and moves their timers' clock."""

    def __init__(self, client: InterlockClient, timers: ClockTimers) -> None:
        self.client = client
        self.timers = timers

    async def run_until(
        self, run_id: str, predicate: Callable[[RunState], bool], what: str, wait: float = WAIT
    ) -> RunState:
        """Wait (in real time, at most ``wait``) until the run's state satisfies ``predicate``."""
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            try:
                state = await self.client.state(run_id)
            except UnknownRun:  # not started yet
                state = RunState(run_id=run_id)
            if state.status != "new" and predicate(state):
                return state
            if asyncio.get_running_loop().time() > deadline:
                log = "\n".join(ev.encode(r).decode()[:240] for r in await self.records(run_id))
                raise AssertionError(
                    f"run {run_id} never got {what}; it is {state.status} in {state.state} "
                    f"({state.error}); its log:\n{log}"
                )
            await asyncio.sleep(0.02)

    async def advance(self, run_id: str, seconds: float) -> None:
        """Advance the clock once every timer the run has set is scheduled (the relay
        schedules them just after they are appended)."""
        await self.run_until(
            run_id, lambda s: all(self.timers.knows(t) for t in s.timers), "its timers scheduled"
        )
        await self.timers.advance(seconds)

    async def finished(self, run_id: str) -> RunState:
        return await self.client.wait(run_id, WAIT)

    async def records(self, run_id: str) -> list[ev.AnyRecord]:
        return await self.client.read(run_id)
