"""Slots freed at once: by the orchestrator that appended the record ending their run.

A run holds its concurrency slots until the record that ends it (completed, failed,
cancelled, continued) is in its log; the relay, reading that record, frees them and hands
them to the next runs in line (:mod:`concurrency`). Under load the relay reads a record
some milliseconds to tens of milliseconds after its append, and every slot handed on
waits that long. So the orchestrator whose decision ended a run that held slots frees
them as soon as the append is acknowledged, as it dispatches the actions a decision
requests (:mod:`dispatch`): the record is in the log, so the effect still follows it.

The relay, reading the record later, asks :meth:`FreeAtOnce.settled` (or waits for
:meth:`FreeAtOnce.freed`) and frees nothing when it was done here. If freeing here failed,
or the process died before it was done, the relay frees the slots as before (another
replica's relay too: a release of a run no longer holding finds it gone and checks the
holders instead). Only a run that was admitted (it entered a state) is freed here: a run
ended while still in line leaves it through the relay, which put it there, in log order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence

from interlock.core import events as ev
from interlock.runtime.capacity import Capacity
from interlock.runtime.capfreeing import RequestFrees, freed_here
from interlock.runtime.concurrency import Admission
from interlock.runtime.runs import Runs

log = logging.getLogger("interlock.freeing")

ENDS = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunContinued)
KEPT = 4096
"""Runs freed here remembered for the relay (the oldest forgotten: the relay frees again,
which costs a read of the holders, never a slot)."""


class FreeAtOnce:
    """The slots of runs whose end this process appended, freed once it is acknowledged:
    those of every run ended in one turn of the loop together (one task; one change of
    each entry for all of them: :meth:`Admission.ended_all`)."""

    def __init__(self, admission: Admission, runs: Runs, capacity: Capacity) -> None:
        """Told what ``runs`` appends, after whoever is told already (the dispatcher)."""
        self._admission, self._runs = admission, runs
        self.requests = RequestFrees(capacity)
        """The capability slots of requests admitted at once here (:mod:`capfreeing`)."""
        self._freeing: OrderedDict[str, asyncio.Task[bool]] = OrderedDict()
        self._open: tuple[list[tuple[str, list[ev.SlotClaim]]], asyncio.Task[bool]] | None = None
        """The runs ended in this turn of the loop, and the task that frees them (it takes
        them, and no more, when it starts)."""
        self._stopping = False
        told = runs.on_appended

        def appended(records: Sequence[ev.AnyRecord]) -> None:
            if told is not None:
                told(records)
            self.appended(records)

        runs.on_appended = appended

    def appended(self, records: Sequence[ev.AnyRecord]) -> None:
        """A decision's records, its append acknowledged: the slots of a run they end
        freed in the background (told in the next turn of the loop, in the order
        appended), and those of the requests they end (:attr:`requests`)."""
        self.requests.appended(records)
        for record in records:
            if not isinstance(record, ENDS) or self._stopping:
                continue
            run_id = record.subject
            entry = self._runs.cached(run_id)
            if entry is None or entry.state.slots is None or run_id in self._freeing:
                continue
            if not entry.state.state:
                continue  # never admitted: its place in line is the relay's to take out
            if self._open is None:
                batch: list[tuple[str, list[ev.SlotClaim]]] = []
                self._open = batch, asyncio.get_running_loop().create_task(self._free(batch))
            self._open[0].append((run_id, entry.state.slots))
            self._freeing[run_id] = self._open[1]
            while len(self._freeing) > KEPT:
                oldest = next(iter(self._freeing))
                if not self._freeing[oldest].done():
                    break  # still at work: kept (at most a few)
                del self._freeing[oldest]

    async def _free(self, batch: list[tuple[str, list[ev.SlotClaim]]]) -> bool:
        self._open = None  # (the runs ended from now on go in the next batch)
        try:
            await self._admission.ended_all(batch)
        # The relay frees them (and says so if it cannot either); a process that stops
        # stops these changes half way, which is no news.
        except Exception as exc:  # noqa: BLE001
            runs = ", ".join(run_id for run_id, _ in batch)
            log.info("could not free the slots of runs %s at once: %s", runs, exc)
            return False
        return True

    def in_flight(self, run_id: str, records: Sequence[ev.AnyRecord]) -> asyncio.Task[bool] | None:
        """The freeing here of the run that ``records`` end, while it is not done yet
        (None: none of them ends it, or it is done, or it is not freed here; no I/O)."""
        task = self._freeing.get(run_id)
        if task is None or task.done():
            return None
        return task if any(isinstance(r, ENDS) for r in records) else None

    def settled(self, run_id: str) -> bool:
        """Whether the run's slots were freed here already (no I/O)."""
        return freed_here(self._freeing.get(run_id))

    async def freed(self, run_id: str) -> bool:
        """Whether the run's slots were freed here (waited for while being freed)."""
        task = self._freeing.get(run_id)
        if task is None:
            return False
        if not task.done():
            await asyncio.wait({task})
        return self.settled(run_id)

    async def stop(self) -> None:
        """Stop freeing (what is left is the relay's, here or in another process)."""
        self._stopping = True
        await self.requests.stop()
        tasks = [t for t in self._freeing.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
