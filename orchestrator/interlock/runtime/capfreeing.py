"""Capability slots freed at once: by the orchestrator that appended the end of a request it
admitted at once.

A request of a capability with a concurrency limit holds its slot until the record that
ends it (completed, failed, cancelled, timed out) is in its run's log; the relay, reading
that record, frees the slot and hands it to the next request in line
(:meth:`Capacity.freed`), on its awaited path. A request admitted at once here
(:mod:`atonce`: its slot taken before the append of its ``action.requested``) whose end
this process appended has its slot freed here as soon as the append is acknowledged, as
a run's slots are (:mod:`freeing`): the ends appended in one turn of the loop together,
in one task, one change of each limit's entry for all of them (:meth:`Slots.release_all`:
one compare-and-set, one pass over its holders), the requests moved into the slots that
frees taken on in line order.

The relay, reading the end, waits for a free still in flight here and then has nothing
of it to await; it frees what was not freed here (the free failed, the process died
between the append and the free, another replica reads the record: a release of a
request no longer holding finds it gone and checks the holders instead). Only a plain
end is freed here: not a cancelled attempt's slot, held while its worker stops
(``stopping_until``), nor an end that holds a rate (``rate_held_until``) or names a
pause's line: those take the relay's path as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from interlock.core import events as ev
from interlock.core.capacity import freed_by
from interlock.core.pauses import is_pause
from interlock.runtime.capacity import Capacity, waiter_id

log = logging.getLogger("interlock.freeing")

ENDS = (ev.ActionCompleted, ev.ActionFailed, ev.ActionCancelled, ev.RunCancelled)
"""The records that may end requests (:func:`freed_by`)."""
Request = tuple[str, str, int]
"""(run id, action id, attempt)."""
KEPT = 4096
"""Runs and requests freed here remembered for the relay, each (the oldest forgotten: the
relay frees again, which costs a read of the holders, never a slot)."""


K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def freed_here(task: asyncio.Task[bool] | None) -> bool:
    """Whether a freeing at once (``task``) is done and freed what it was given (no I/O)."""
    return (
        task is not None
        and task.done()
        and not task.cancelled()
        and task.exception() is None
        and task.result()
    )


class TurnBatches(Generic[K, T]):
    """What is added in one turn of the loop, freed together by one task (``free``, given
    the batch; whether it freed it), and the task of each key added, the last
    :data:`KEPT` remembered (runs' slots, :mod:`freeing`; requests', :class:`RequestFrees`)."""

    def __init__(self, free: Callable[[list[T]], Awaitable[bool]]) -> None:
        self._free = free
        self.tasks: OrderedDict[K, asyncio.Task[bool]] = OrderedDict()
        self._open: tuple[list[T], asyncio.Task[bool]] | None = None
        """The batch of this turn, and the task that frees it (it takes the batch, and
        no more, when it starts)."""

    def add(self, key: K, item: T) -> asyncio.Task[bool]:
        """``item`` freed with the others of this turn: the task that frees them."""
        if self._open is None:
            batch: list[T] = []
            self._open = batch, asyncio.get_running_loop().create_task(self._run(batch))
        self._open[0].append(item)
        self.tasks[key] = task = self._open[1]
        while len(self.tasks) > KEPT:
            oldest = next(iter(self.tasks))
            if not self.tasks[oldest].done():
                break  # still at work: kept (at most a few)
            del self.tasks[oldest]
        return task

    async def _run(self, batch: list[T]) -> bool:
        self._open = None  # (what is added from now on goes in the next batch)
        return await self._free(batch)

    async def stop(self) -> None:
        """Cancel every freeing not done (what is left is the relay's)."""
        tasks = [t for t in self.tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class RequestFrees:
    """The capability slots of requests admitted at once here whose end this process
    appended, freed once it is acknowledged (those of one turn of the loop together)."""

    def __init__(self, capacity: Capacity) -> None:
        self._capacity = capacity
        self._batches: TurnBatches[Request, tuple[Request, list[ev.SlotClaim]]]
        self._batches = TurnBatches(self._free)
        """The requests ended in a turn of the loop, with their slots' claims."""
        self._freeing = self._batches.tasks
        self._by_run: dict[str, asyncio.Task[bool]] = {}
        """Each run with a request being freed here: the task (the last) that frees it."""
        self._stopping = False

    def frees(self, run_id: str, slots: ev.FreedSlots) -> bool:
        """Whether the slots an end names are freed here (no I/O): a request admitted at
        once here, not stopping, holding no rate, in no pause's line, with a slot."""
        return (
            slots.stopping_until is None
            and slots.rate_held_until is None
            and (run_id, slots.action_id, slots.attempt) in self._capacity.at_once
            and not any(is_pause(c) for c in slots.limits)
            and any(not c.per_s for c in slots.limits)
        )

    def appended(self, records: Sequence[ev.AnyRecord]) -> None:
        """A decision's records, its append acknowledged: the slots of the requests they
        end freed in the background (in the next turn of the loop, in the order appended)."""
        if self._stopping or not self._capacity.at_once:
            return  # (none admitted at once here: nothing of these is freed here)
        for record in records:
            for slots in freed_by(record):
                request = (record.subject, slots.action_id, slots.attempt)
                if request in self._freeing or not self.frees(record.subject, slots):
                    continue
                claims = [c for c in slots.limits if not c.per_s]
                self._by_run[record.subject] = self._batches.add(request, (request, claims))

    async def _free(self, batch: list[tuple[Request, list[ev.SlotClaim]]]) -> bool:
        by_entry: dict[tuple[str, str], list[tuple[ev.SlotClaim, str]]] = {}
        for request, claims in batch:
            for claim in claims:
                by_entry.setdefault((claim.limit, claim.key), []).append(
                    (claim, waiter_id(*request))
                )
        gone = {waiter_id(*request) for request, _ in batch}
        try:
            for key in sorted(by_entry):
                for other in await self._capacity.slots.release_all(by_entry[key]):
                    if other not in gone:
                        await self._capacity.go_on_named(other)
        # The relay frees them (and says so if it cannot either); a process that stops
        # stops these changes half way, which is no news.
        except Exception as exc:  # noqa: BLE001
            names = ", ".join(sorted(gone))
            log.info("could not free the capability slots of %s at once: %s", names, exc)
            return False
        finally:
            me = asyncio.current_task()
            for (run_id, _, _), _ in batch:
                if self._by_run.get(run_id) is me:
                    del self._by_run[run_id]
        return True

    def in_flight(self, run_id: str, records: Sequence[ev.AnyRecord]) -> asyncio.Task[bool] | None:
        """A freeing here, not done yet, of a request of the run when ``records`` may end
        one (no I/O)."""
        task = self._by_run.get(run_id)
        if task is None or task.done():
            return None
        return task if any(isinstance(r, ENDS) for r in records) else None

    def _settled(self, request: Request) -> bool:
        return freed_here(self._freeing.get(request))

    def unsettled(self, run_id: str, freed: list[ev.FreedSlots]) -> list[ev.FreedSlots]:
        """What of ``freed`` (an end's) was not freed here already (no I/O)."""
        if not freed or not self._freeing:
            return freed
        return [s for s in freed if not self._settled((run_id, s.action_id, s.attempt))]

    async def left(self, run_id: str, freed: list[ev.FreedSlots]) -> list[ev.FreedSlots]:
        """What of ``freed`` (an end's) is left to free (a freeing here waited for); what
        was freed here is forgotten by the capacity."""
        if not freed or not self._freeing:
            return freed
        left: list[ev.FreedSlots] = []
        for slots in freed:
            request = (run_id, slots.action_id, slots.attempt)
            task = self._freeing.get(request)
            if task is not None and not task.done():
                await asyncio.wait({task})
            if self._settled(request):
                self._capacity.forget_ended(run_id, [slots])
            else:
                left.append(slots)
        return left

    async def stop(self) -> None:
        """Stop freeing (what is left is the relay's, here or in another process)."""
        self._stopping = True
        await self._batches.stop()
