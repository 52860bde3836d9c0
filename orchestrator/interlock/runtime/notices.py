"""Cancel notices to the agents working on actions a run no longer wants, and the removal
of those actions' requests no agent has taken yet (:mod:`taskqueue`).

A notice goes to ``<prefix>.control.<capability>.<run id>``: the capability of each action
is as the relay saw it requested here, else read from the run's log (another replica
relayed the request). A child run's action has no agent: its run is cancelled instead
(:mod:`flow`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable

from nats.aio.client import Client

from interlock.core import events as ev
from interlock.runtime.logstore import LogStore
from interlock.runtime.taskqueue import TaskQueue
from interlock.transport import tasks
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.flow")

KNOWN = 16_384
"""Actions whose capability is remembered."""


class CancelNotices:
    """Tells agents to stop, and takes the requests they have not taken out of the queue."""

    def __init__(self, nc: Client, subjects: Subjects, queue: TaskQueue, runs: LogStore) -> None:
        self._nc = nc
        self._subjects = subjects
        self._queue = queue
        self._log = runs
        self._capability_of: OrderedDict[str, str] = OrderedDict()
        """Action id -> capability, of the requests this process has seen."""

    def note(self, action_id: str, capability: str) -> None:
        """The action was requested of ``capability``."""
        self._capability_of[action_id] = capability
        self._capability_of.move_to_end(action_id)
        if len(self._capability_of) > KNOWN:
            self._capability_of.popitem(last=False)

    async def tell(
        self, run_id: str, action_ids: Iterable[str], time: str, attempt: int | None = None
    ) -> list[tuple[str, int]]:
        """Publish a cancel notice for each action of the run (about one attempt of it,
        or, None, all of it); their requests no agent has taken yet leave the queue, looked
        for in one scan per capability where needed (:class:`TaskQueue`). The (action id,
        attempt) of the requests taken out that no worker had been handed: nobody works
        on them, nor will."""
        found = await self._requests(run_id, action_ids, attempt)
        by_capability: dict[str, dict[str, int | None]] = {}
        for action_id, (capability, last) in found.items():
            headers, payload = tasks.encode_cancel(
                run_id=run_id, action_id=action_id, time=time, attempt=attempt
            )
            subject = self._subjects.control(capability, run_id)
            await self._nc.publish(subject, payload, headers=headers)
            by_capability.setdefault(capability, {})[action_id] = last
        never_taken: list[tuple[str, int]] = []
        for capability, requests in by_capability.items():
            exact = attempt is not None
            await self._queue.remove(capability, requests, exact=exact, never_taken=never_taken)
        return never_taken

    async def _requests(
        self, run_id: str, action_ids: Iterable[str], attempt: int | None
    ) -> dict[str, tuple[str, int | None]]:
        """Action id -> (capability, the attempt its run requested last; None: not read)
        of the actions an agent works on.

        The last attempt is ``attempt`` when given; else it is read from the log only for
        an action whose request was dispatched here (the queue knows its sequence, maybe
        an earlier attempt's, while another replica may have dispatched the last one):
        any other is looked for in the queue, every attempt of it."""
        out: dict[str, tuple[str, int | None]] = {}
        unread: list[str] = []
        for action_id in action_ids:
            capability = self._capability_of.get(action_id)
            if capability is None or (attempt is None and self._queue.knows(action_id)):
                unread.append(action_id)
            else:
                out[action_id] = (capability, attempt)
        if not unread:
            return out
        wanted = set(unread)
        records, _ = await self._log.read(run_id, consistent=True)
        for record in records:
            if isinstance(record, ev.ActionRequested) and record.data.action_id in wanted:
                d = record.data
                if d.workflow:
                    continue
                self.note(d.action_id, d.capability)
                out[d.action_id] = (d.capability, attempt or d.attempt)
        for action_id in unread:
            if action_id not in out:
                log.debug("no agent works on %s of run %s: nobody to tell", action_id, run_id)
        return out
