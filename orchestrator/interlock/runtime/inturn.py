"""Batches of run-log messages acted on side by side, each run's records still in log order.

The relay acted on one batch at a time: the next batch was read only once every effect of
the last one was done. An effect that waits on a round trip or two (a slot freed and given
to the next run in line, which is then admitted) held up every other run's records behind
it, and a run whose admission could not be recorded yet held up every later run of every
key. Measured with one limit of 10 slots and a flood of 2,000 runs of one key on a loaded
2-core machine: the flood was served in 17-26 s one batch at a time, 11-12 s with batches
side by side (``python -m bench fairness`` measures a second key's wait beside it).

So up to :data:`IN_FLIGHT` batches are acted on at once. A run's records in a later batch
wait for its records in earlier ones (:class:`Turns`), so each run's effects stay in log
order; the messages of a batch are acknowledged, as before, once their effects are done,
so a crash still leaves every effect not done to whichever process relays next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

IN_FLIGHT = 8
"""Batches acted on at once by one relay loop (each up to the relay's pull size)."""


class Turns:
    """Per run, the batch acting on its records now: a later batch's records of the same
    run wait for it."""

    def __init__(self) -> None:
        self._busy: dict[str, asyncio.Future[None]] = {}

    def line_up(self, run_ids: Iterable[str]) -> Batch:
        """Claim the runs for a batch (call in log order, before the batch awaits
        anything): what each must wait for first."""
        loop = asyncio.get_running_loop()
        before: dict[str, asyncio.Future[None] | None] = {}
        mine: dict[str, asyncio.Future[None]] = {}
        for run_id in run_ids:
            if run_id in mine:
                continue
            before[run_id] = self._busy.get(run_id)
            mine[run_id] = self._busy[run_id] = loop.create_future()
        return Batch(self._busy, before, mine)

    @property
    def busy(self) -> int:
        """Runs with records being acted on."""
        return len(self._busy)


class Batch:
    """One batch's place in its runs' turns (see :meth:`Turns.line_up`)."""

    def __init__(
        self,
        busy: dict[str, asyncio.Future[None]],
        before: dict[str, asyncio.Future[None] | None],
        mine: dict[str, asyncio.Future[None]],
    ) -> None:
        self._busy, self._before, self._mine = busy, before, mine

    def waits(self, run_id: str) -> bool:
        """Whether an earlier batch still acts on the run's records."""
        found = self._before.get(run_id)
        return found is not None and not found.done()

    async def in_turn(
        self, run_id: str, effects: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``effects(*args, **kwargs)`` once the earlier batches are done with the run."""
        found = self._before.get(run_id)
        if found is not None and not found.done():
            # Shielded: a wait cancelled here must not cancel the earlier batch's turn.
            await asyncio.shield(found)
        return await effects(*args, **kwargs)

    def done(self) -> None:
        """The batch is done with its runs (or stopped): later batches go on."""
        for run_id, future in self._mine.items():
            if not future.done():
                future.set_result(None)
            if self._busy.get(run_id) is future:
                del self._busy[run_id]


class Acting:
    """The batches one relay loop acts on at once (at most :data:`IN_FLIGHT`)."""

    def __init__(self) -> None:
        self.turns = Turns()
        self._tasks: set[asyncio.Task[None]] = set()

    async def act(self, run_ids: Iterable[str], batch: Callable[[Batch], Awaitable[None]]) -> None:
        """Start ``batch`` (given its turn: the runs of its messages, in log order, lined
        up at once), then wait until fewer than the limit run: the next batch is taken only
        then, so that no batch waits here unacted on (and unrenewed) for long."""
        turn = self.turns.line_up(run_ids)
        self._tasks.add(asyncio.create_task(_in_turn(batch, turn)))
        await bounded(self._tasks)

    async def stop(self) -> None:
        await stop_all(self._tasks)


async def _in_turn(batch: Callable[[Batch], Awaitable[None]], turn: Batch) -> None:
    try:
        await batch(turn)
    finally:
        turn.done()


async def bounded(tasks: set[asyncio.Task[None]], limit: int = IN_FLIGHT) -> None:
    """Wait until fewer than ``limit`` of ``tasks`` are running; a task that failed
    raises its error here (the loop that started it stops, as it would have)."""
    while True:
        for task in [t for t in tasks if t.done()]:
            tasks.discard(task)
            failed = None if task.cancelled() else task.exception()
            if failed is not None:
                raise failed
        if len(tasks) < limit:
            return
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)


async def stop_all(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel the batches still running and wait for them to end."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()
