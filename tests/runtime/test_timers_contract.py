"""One contract for both timer adapters: JetStream message scheduling and the advanceable
clock used by the control-flow tests. What passes here for one must pass for the other."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Protocol

import nats
import pytest

from interlock.core.rfc3339 import format_time, parse_time
from interlock.runtime.timers import ClockTimers, JetStreamTimers, ManualClock
from interlock.transport.clock import utc_now
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects


class Harness(Protocol):
    fired: list[tuple[str, str]]
    moments: list[datetime]
    """When each timer of ``fired`` was delivered, by the harness's clock."""

    def at(self, seconds: float) -> str: ...
    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None: ...
    async def settle(self, run_id: str, after: str) -> None: ...


BARRIER = "barrier"


class ClockHarness:
    def __init__(self) -> None:
        self.clock = ManualClock(utc_now())
        self.timers = ClockTimers(self.clock)
        self.fired: list[tuple[str, str]] = []
        self.moments: list[datetime] = []

        async def deliver(run_id: str, timer_id: str) -> None:
            if timer_id != BARRIER:
                self.fired.append((run_id, timer_id))
                self.moments.append(self.clock.moment)

        self.timers.start(deliver)

    def at(self, seconds: float) -> str:
        return format_time(self.clock.moment + timedelta(seconds=seconds))

    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None:
        await self.timers.schedule(run_id, timer_id, fire_at)

    async def settle(self, run_id: str, after: str) -> None:
        """Schedule a barrier timer for ``run_id`` just after ``after`` and move the clock
        on to it: every timer due before it has been delivered by then."""
        barrier = parse_time(after) + timedelta(seconds=0.5)
        await self.timers.schedule(run_id, BARRIER, format_time(barrier))
        await self.timers.advance((barrier - self.clock.moment).total_seconds())


class JetStreamHarness:
    def __init__(self, timers: JetStreamTimers) -> None:
        self.timers = timers
        self.fired: list[tuple[str, str]] = []
        self.moments: list[datetime] = []
        self._barriers: set[str] = set()
        self._new = asyncio.Event()

        async def deliver(run_id: str, timer_id: str) -> None:
            if timer_id.startswith(BARRIER):
                self._barriers.add(timer_id)
            else:
                self.fired.append((run_id, timer_id))
                self.moments.append(parse_time(utc_now()))
            self._new.set()

        self.timers.start(deliver)

    def at(self, seconds: float) -> str:
        return format_time(parse_time(utc_now()) + timedelta(seconds=seconds))

    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None:
        await self.timers.schedule(run_id, timer_id, fire_at)

    async def settle(self, run_id: str, after: str) -> None:
        """Schedule a barrier timer for ``run_id`` just after ``after`` and wait until it is
        delivered: the server fires a run's timers onto one subject in time order, and
        they are delivered in that order, so every one due before it has been delivered by
        then (a positive event, not a sleep)."""
        barrier = f"{BARRIER}-{len(self._barriers)}"
        fire_at = format_time(parse_time(after) + timedelta(seconds=0.5))
        await self.timers.schedule(run_id, barrier, fire_at)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        while barrier not in self._barriers:
            remaining = deadline - loop.time()
            assert remaining > 0, f"the barrier timer due at {fire_at} never fired"
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), remaining)


SETTLE_S = 30.0
"""How long a barrier timer may take to come back past its time (a loaded machine)."""


@pytest.fixture(params=["clock", "jetstream"])
async def harness(
    request: pytest.FixtureRequest, nats_url: str, subjects: Subjects
) -> AsyncIterator[Harness]:
    if request.param == "clock":
        yield ClockHarness()
        return
    nc = await nats.connect(nats_url)
    await provision(nc.jetstream(), subjects)
    timers = JetStreamTimers(nc, subjects)
    try:
        yield JetStreamHarness(timers)
    finally:
        await timers.stop()
        await nc.close()


def on_time(harness: Harness, *fire_at: str) -> None:
    """Each timer delivered no earlier than its time."""
    for moment, due in zip(harness.moments, fire_at, strict=True):
        assert moment >= parse_time(due), f"delivered at {moment}, due at {due}"


async def test_a_timer_fires_once_after_its_time(harness: Harness) -> None:
    fire_at = harness.at(0.8)
    await harness.schedule("r1", "r1:4", fire_at)
    await harness.settle("r1", fire_at)
    assert harness.fired == [("r1", "r1:4")]
    on_time(harness, fire_at)
    # A later barrier: the timer was not delivered a second time meanwhile.
    await harness.settle("r1", harness.at(0.5))
    assert harness.fired == [("r1", "r1:4")]


async def test_scheduling_a_timer_twice_fires_it_once(harness: Harness) -> None:
    fire_at = harness.at(0.5)
    await harness.schedule("r2", "r2:7", fire_at)
    await harness.schedule("r2", "r2:7", fire_at)
    await harness.settle("r2", fire_at)
    assert harness.fired == [("r2", "r2:7")]
    on_time(harness, fire_at)


async def test_a_timer_already_due_fires_at_once(harness: Harness) -> None:
    await harness.schedule("r3", "r3:2", harness.at(-5))
    await harness.settle("r3", harness.at(0))
    assert harness.fired == [("r3", "r3:2")]


async def test_timers_fire_in_time_order(harness: Harness) -> None:
    late, early = harness.at(1.0), harness.at(0.3)
    await harness.schedule("r4", "late", late)
    await harness.schedule("r4", "early", early)
    await harness.settle("r4", late)
    assert harness.fired == [("r4", "early"), ("r4", "late")]
    on_time(harness, early, late)
