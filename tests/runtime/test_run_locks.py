"""Per-run locks: one decision at a time on a run, and no lock left once nobody needs it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from interlock.runtime.logstore import MemoryRunLog
from interlock.runtime.runs import Runs


def _runs() -> Runs:
    registry: Any = None  # locking reads no definition
    return Runs(MemoryRunLog(), registry)


async def test_one_holder_at_a_time_in_the_order_they_came() -> None:
    runs = _runs()
    order: list[tuple[str, int]] = []

    async def hold(n: int) -> None:
        async with runs.locked("r1"):
            order.append(("in", n))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            order.append(("out", n))

    await asyncio.gather(*(hold(n) for n in range(3)), hold_other(runs, order))
    mine = [step for step in order if step[1] >= 0]
    assert mine == [("in", 0), ("out", 0), ("in", 1), ("out", 1), ("in", 2), ("out", 2)]
    assert ("other", -1) in order[:2]  # another run's lock did not wait for r1's
    assert not runs._locks


async def hold_other(runs: Runs, order: list[tuple[str, int]]) -> None:
    async with runs.locked("r2"):
        order.append(("other", -1))


async def test_a_failing_holder_and_a_cancelled_waiter_leave_no_lock() -> None:
    runs = _runs()
    entered, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with runs.locked("r1"):
            entered.set()
            await release.wait()
            raise ValueError("decision failed")

    async def waiter() -> None:
        async with runs.locked("r1"):
            raise AssertionError("never gets the lock")

    held = asyncio.create_task(holder())
    await entered.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    assert runs._locks["r1"][1] == [2]
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    release.set()
    with pytest.raises(ValueError, match="decision failed"):
        await held
    assert not runs._locks
    async with runs.locked("r1"):
        assert runs._locks["r1"][1] == [1]
    assert not runs._locks
