"""cancel_and_wait: a task whose cancellation is lost still ends, and the caller's own
cancellation is never swallowed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from interlock.transport.cancelling import cancel_and_wait


async def _ignores_first_cancellation(started: asyncio.Event, caught: list[int]) -> None:
    """Carries on after its first cancellation, as a loop does whose cancellation was lost."""
    started.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        caught.append(1)
    await asyncio.Event().wait()  # only a second cancellation ends it


async def _waits_for_in_a_loop(
    futures: asyncio.Queue[asyncio.Future[int]], waiting: asyncio.Queue[int], rounds: list[int]
) -> None:
    """A reader that goes round ``asyncio.wait_for`` as nats-py's timed reads do (it says
    which round it waits in)."""
    while True:
        fut = await futures.get()
        waiting.put_nowait(len(rounds))
        rounds.append(await asyncio.wait_for(fut, 30))


async def test_a_task_that_carries_on_after_its_first_cancellation_still_ends() -> None:
    started, caught = asyncio.Event(), []
    task = asyncio.create_task(_ignores_first_cancellation(started, caught))
    await started.wait()
    left = await cancel_and_wait(task, again=0.05)
    assert left == set()
    assert task.cancelled()
    assert caught == [1]  # the first cancellation was really lost


async def test_a_cancellation_lost_by_wait_for_is_made_again() -> None:
    # Provoked deterministically: the awaited future completes and the task is cancelled
    # in the same turn of the loop. Python 3.11's wait_for returns the result and drops
    # the cancellation; the loop then waits on its next read.
    futures: asyncio.Queue[asyncio.Future[int]] = asyncio.Queue()
    waiting: asyncio.Queue[int] = asyncio.Queue()
    rounds: list[int] = []
    task = asyncio.create_task(_waits_for_in_a_loop(futures, waiting, rounds))
    loop = asyncio.get_running_loop()
    first = loop.create_future()
    futures.put_nowait(first)
    futures.put_nowait(loop.create_future())
    assert await waiting.get() == 0
    first.set_result(1)
    task.cancel()
    if sys.version_info < (3, 12):
        assert await waiting.get() == 1  # it went round and waits on its next read
        assert not task.done()
    assert await cancel_and_wait(task, again=0.05) == set()
    assert task.done()


async def test_the_callers_cancellation_is_raised_and_the_task_cancelled_again() -> None:
    released = asyncio.Event()
    cancels: asyncio.Queue[int] = asyncio.Queue()

    async def stubborn() -> None:
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                cancels.put_nowait(1)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    caller = asyncio.create_task(cancel_and_wait(task, again=60))
    await cancels.get()  # cancelled once (and it carried on)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await cancels.get()  # cancelled once more on the caller's way out
    assert cancels.empty()
    released.set()
    await task


async def test_a_task_that_never_ends_is_given_back_after_the_limit() -> None:
    released = asyncio.Event()

    async def deaf() -> None:
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(deaf())
    await asyncio.sleep(0)
    assert await cancel_and_wait(task, again=0.02, limit=0.1) == {task}
    released.set()
    await task


async def test_ended_failed_and_missing_tasks_are_passed_over() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def ends() -> int:
        return 1

    failed, ended = asyncio.create_task(fails()), asyncio.create_task(ends())
    await asyncio.wait({failed, ended})
    running = asyncio.create_task(asyncio.Event().wait())
    assert await cancel_and_wait(failed, None, ended, running) == set()
    assert running.cancelled()
    assert ended.result() == 1
    assert await cancel_and_wait() == set()
