"""One contract for both timer adapters: JetStream message scheduling and the advanceable
clock used by the control-flow tests. What passes here for one must pass for the other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Protocol

import nats
import pytest

from interlock.core.rfc3339 import format_time, parse_time
from interlock.runtime.runs import utc_now
from interlock.runtime.timers import ClockTimers, JetStreamTimers, ManualClock
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects


class Harness(Protocol):
    fired: list[tuple[str, str]]

    def at(self, seconds: float) -> str: ...
    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None: ...
    async def pass_time(self, seconds: float) -> None: ...


class ClockHarness:
    def __init__(self) -> None:
        self.clock = ManualClock(utc_now())
        self.timers = ClockTimers(self.clock)
        self.fired: list[tuple[str, str]] = []

        async def deliver(run_id: str, timer_id: str) -> None:
            self.fired.append((run_id, timer_id))

        self.timers.start(deliver)

    def at(self, seconds: float) -> str:
        return format_time(self.clock.moment + timedelta(seconds=seconds))

    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None:
        await self.timers.schedule(run_id, timer_id, fire_at)

    async def pass_time(self, seconds: float) -> None:
        await self.timers.advance(seconds)


class JetStreamHarness:
    def __init__(self, timers: JetStreamTimers) -> None:
        self.timers = timers
        self.fired: list[tuple[str, str]] = []

        async def deliver(run_id: str, timer_id: str) -> None:
            self.fired.append((run_id, timer_id))

        self.timers.start(deliver)

    def at(self, seconds: float) -> str:
        return format_time(parse_time(utc_now()) + timedelta(seconds=seconds))

    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None:
        await self.timers.schedule(run_id, timer_id, fire_at)

    async def pass_time(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


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


async def test_a_timer_fires_once_after_its_time(harness: Harness) -> None:
    await harness.schedule("r1", "r1:4", harness.at(0.8))
    await harness.pass_time(0.3)
    assert harness.fired == []
    await harness.pass_time(1.5)
    assert harness.fired == [("r1", "r1:4")]
    await harness.pass_time(0.5)
    assert harness.fired == [("r1", "r1:4")]


async def test_scheduling_a_timer_twice_fires_it_once(harness: Harness) -> None:
    fire_at = harness.at(0.5)
    await harness.schedule("r2", "r2:7", fire_at)
    await harness.schedule("r2", "r2:7", fire_at)
    await harness.pass_time(1.5)
    assert harness.fired == [("r2", "r2:7")]


async def test_a_timer_already_due_fires_at_once(harness: Harness) -> None:
    await harness.schedule("r3", "r3:2", harness.at(-5))
    await harness.pass_time(0.5)
    assert harness.fired == [("r3", "r3:2")]


async def test_timers_fire_in_time_order(harness: Harness) -> None:
    await harness.schedule("r4", "late", harness.at(1.0))
    await harness.schedule("r4", "early", harness.at(0.3))
    await harness.pass_time(2.0)
    assert harness.fired == [("r4", "early"), ("r4", "late")]
