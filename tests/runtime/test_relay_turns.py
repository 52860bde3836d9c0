"""Batches of run-log records acted on at once keep each run's records in log order."""

from __future__ import annotations

import asyncio

import pytest

from interlock.runtime.inturn import Turns, bounded, stop_all


async def test_a_runs_later_records_wait_for_its_earlier_ones_and_others_do_not() -> None:
    turns = Turns()
    done: list[str] = []
    hold = asyncio.Event()
    first = turns.line_up(["a", "b", "a"])
    second = turns.line_up(["a", "c"])
    assert not first.waits("a")
    assert not first.waits("b")
    assert second.waits("a")
    assert not second.waits("c")

    async def effect(name: str, wait: asyncio.Event | None = None) -> str:
        if wait is not None:
            await wait.wait()
        done.append(name)
        return name

    async def batch_one() -> None:
        try:
            await asyncio.gather(
                first.in_turn("a", effect, "a1", hold),
                first.in_turn("b", effect, "b1"),
            )
        finally:
            first.done()

    async def batch_two() -> None:
        try:
            await asyncio.gather(
                second.in_turn("a", effect, "a2"), second.in_turn("c", effect, "c2")
            )
        finally:
            second.done()

    tasks = [asyncio.create_task(batch_one()), asyncio.create_task(batch_two())]
    for _ in range(5):
        await asyncio.sleep(0)
    assert done == ["b1", "c2"]  # a's second record waits for its first, held
    hold.set()
    await asyncio.gather(*tasks)
    assert done == ["b1", "c2", "a1", "a2"]
    assert turns.busy == 0


async def test_a_stopped_batch_lets_the_later_ones_go_on() -> None:
    turns = Turns()
    first = turns.line_up(["a"])
    second = turns.line_up(["a"])
    blocked = asyncio.create_task(first.in_turn("a", asyncio.sleep, 3600))
    later = asyncio.create_task(second.in_turn("a", asyncio.sleep, 0, "went on"))
    await asyncio.sleep(0)
    blocked.cancel()
    first.done()
    assert await asyncio.wait_for(later, 5) == "went on"


async def test_at_most_the_limit_of_batches_run_and_a_failed_one_is_raised() -> None:
    release = asyncio.Event()
    tasks = {asyncio.create_task(release.wait()) for _ in range(2)}
    waiting = asyncio.create_task(bounded(tasks, limit=2))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    release.set()
    await asyncio.wait_for(waiting, 5)

    async def fails() -> None:
        raise RuntimeError("batch failed")

    failing = {asyncio.create_task(fails())}
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="batch failed"):
        await bounded(failing)
    await stop_all(tasks)
    assert not tasks
