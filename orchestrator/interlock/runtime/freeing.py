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
from collections.abc import Sequence

from interlock.core import events as ev
from interlock.runtime.capacity import Capacity
from interlock.runtime.capfreeing import RequestFrees, TurnBatches, freed_here
from interlock.runtime.concurrency import Admission
from interlock.runtime.runs import Runs

log = logging.getLogger("interlock.freeing")

ENDS = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunContinued)


class FreeAtOnce:
    """The slots of runs whose end this process appended, freed once it is acknowledged:
    those of every run ended in one turn of the loop together (one task; one change of
    each entry for all of them: :meth:`Admission.ended_all`)."""

    def __init__(self, admission: Admission, runs: Runs, capacity: Capacity) -> None:
        """Told what ``runs`` appends, after whoever is told already (the dispatcher)."""
        self._admission, self._runs = admission, runs
        self.requests = RequestFrees(capacity)
        """The capability slots of requests admitted at once here (:mod:`capfreeing`)."""
        self._batches: TurnBatches[str, tuple[str, list[ev.SlotClaim]]]
        self._batches = TurnBatches(self._free)
        """The runs ended in a turn of the loop, with their slots' claims."""
        self._freeing = self._batches.tasks
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
            self._batches.add(run_id, (run_id, entry.state.slots))

    async def _free(self, batch: list[tuple[str, list[ev.SlotClaim]]]) -> bool:
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
        await self._batches.stop()
