"""Task requests taken back out of the queue once their run no longer wants them.

The task requests' stream is a work queue: a request stays until an agent acknowledges it.
When the run cancels an action (a run cancelled, a map failing fast) or an attempt times
out, a request no agent has taken yet would stay queued for good where the capability has
no worker: counted in the queue depth (``interlock agents``, GET /agents, the console),
in ``interlock_actions_in_flight`` and by ``InterlockCapabilityWithoutWorker``, and handed
to the first worker that comes, only to be refused. So the orchestrator deletes it.

Its stream sequence is what a delete needs: the dispatcher notes it from the publish's
acknowledgement (a bounded memory of the latest requests). A request dispatched by another
replica, or before a restart, is looked for among the capability's queued requests (by its
``Nats-Msg-Id``, ``<action id>.<attempt>``), at most ``SCAN_LIMIT`` of them. A request an
agent has taken is gone from the stream already, and its agent is told by the cancel
notice: deleting it again finds nothing, which is fine.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from typing import Any

from nats.js.errors import NotFoundError

from interlock.transport.subjects import Subjects
from interlock.transport.tasks import MSG_ID_HEADER

log = logging.getLogger("interlock.taskqueue")

KEPT = 65_536
"""Requests whose stream sequence is remembered."""
SCAN_LIMIT = 256
"""Queued requests of a capability looked through for one whose sequence is not known."""


class TaskQueue:
    """The sequences of the task requests dispatched here, and their removal."""

    def __init__(self, js: Any, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._seqs: OrderedDict[str, dict[int, int]] = OrderedDict()
        """Action id -> its attempts' sequences."""

    def dispatched(self, action_id: str, attempt: int, seq: int) -> None:
        """The request of this attempt is at ``seq`` in the task requests' stream."""
        attempts = self._seqs.get(action_id)
        if attempts is None:
            attempts = self._seqs[action_id] = {}
            if len(self._seqs) > KEPT:
                self._seqs.popitem(last=False)
        else:
            self._seqs.move_to_end(action_id)
        attempts[attempt] = seq

    async def remove(self, capability: str, action_id: str, attempt: int | None = None) -> int:
        """Delete the queued requests of the action (of one attempt, or all of them);
        how many were deleted. Best effort: a failure is logged, never raised."""
        try:
            seqs = self._known(action_id, attempt)
            if not seqs:
                seqs = await self._look_for(capability, action_id, attempt)
            removed = 0
            for seq in seqs:
                with contextlib.suppress(NotFoundError):  # taken by an agent meanwhile
                    removed += bool(await self._js.delete_msg(self._subjects.tasks_stream, seq))
        # Best effort: a request left queued is refused when an agent answers it.
        except Exception as exc:  # noqa: BLE001
            log.warning("could not take the requests of %s out of the queue: %s", action_id, exc)
            return 0
        return removed

    def _known(self, action_id: str, attempt: int | None) -> list[int]:
        attempts = self._seqs.get(action_id)
        if attempts is None:
            return []
        if attempt is None:
            del self._seqs[action_id]
            return list(attempts.values())
        seq = attempts.pop(attempt, None)
        return [] if seq is None else [seq]

    async def _look_for(self, capability: str, action_id: str, attempt: int | None) -> list[int]:
        subject = self._subjects.capability(capability)
        stream = self._subjects.tasks_stream
        wanted = f"{action_id}." if attempt is None else f"{action_id}.{attempt}"
        found: list[int] = []
        seq = 0
        for _ in range(SCAN_LIMIT):
            try:
                msg = await self._js.get_msg(stream, seq + 1, subject=subject, next=True)
            except NotFoundError:
                break
            seq = int(msg.seq or 0)
            msg_id = (msg.headers or {}).get(MSG_ID_HEADER, "")
            if (msg_id.startswith(wanted) if attempt is None else msg_id == wanted) and (
                attempt is not None or msg_id[len(wanted) :].isdigit()
            ):
                found.append(seq)
        return found
