"""Task requests taken back out of the queue once their run no longer wants them.

The task requests' stream is a work queue: a request stays until an agent acknowledges it.
When the run cancels an action (a run cancelled, a map failing fast) or an attempt times
out, a request no agent has taken yet would stay queued for good where the capability has
no worker: counted in the queue depth (``interlock agents``, GET /agents, the console),
in ``interlock_actions_in_flight`` and by ``InterlockCapabilityWithoutWorker``, and handed
to the first worker that comes, only to be refused. So the orchestrator deletes it.

Its stream sequence is what a delete needs: the dispatcher notes it from the publish's
acknowledgement (a bounded memory of the latest requests). A request whose sequence is not
known here (dispatched by another replica, or before a restart) is looked for among all the
capability's queued requests, by its ``Nats-Msg-Id`` (``<action id>.<attempt>``), however
deep the queue: the stream allows direct gets, so the scan reads it in batches of a few
MiB, keeping only their headers, from whichever replica of the stream answers, then reads
what the stream's leader stored after the last request seen (a follower may be a few
messages behind). A request an agent has acknowledged is gone from the stream already,
and its agent is told by the cancel notice: deleting it again finds nothing, which is
fine. Whether a request deleted had been handed to a worker at all is told by the
capability's consumer (the last sequence it handed out, read after the delete): one that
was not has nobody stopping it, and a cancelled attempt's slot need not wait for a stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.js.errors import APIError, NotFoundError

from interlock.transport.directget import scan_headers
from interlock.transport.jetstream import connection
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import MSG_ID_HEADER, consumer_name

log = logging.getLogger("interlock.taskqueue")

KEPT = 65_536
"""Requests whose stream sequence is remembered."""
_SEQUENCE_NOT_FOUND = 10043
_DELETE_FAILED = 10057


def _taken_already(exc: APIError) -> bool:
    """Whether a delete of a request failed because it is gone from the queue already (an
    agent took it). One server says 404; a replicated stream's leader says "sequence N not
    found" (400) or, the delete failing in its store, "no message found" (500)."""
    if isinstance(exc, NotFoundError) or exc.err_code == _SEQUENCE_NOT_FOUND:
        return True
    return exc.err_code == _DELETE_FAILED and "no message found" in (exc.description or "")


class TaskQueue:
    """The sequences of the task requests dispatched here, and their removal."""

    def __init__(self, js: Any, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._seqs: OrderedDict[str, dict[int, int]] = OrderedDict()
        """Action id -> its attempts' sequences."""
        self.scans = 0
        """Queues scanned for requests whose sequence was not known here."""
        self._next: dict[str, _Scan] = {}
        """Capability -> the scan its next lookups join (not started yet)."""
        self._scanning: dict[str, asyncio.Lock] = {}
        """Capability -> held while its queue is scanned."""

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

    def knows(self, action_id: str) -> bool:
        """Whether a request of the action (some attempt of it) was dispatched here."""
        return action_id in self._seqs

    async def remove(
        self,
        capability: str,
        requests: Mapping[str, int | None],
        *,
        exact: bool = False,
        never_taken: list[tuple[str, int]] | None = None,
    ) -> int:
        """Delete the queued requests of ``requests`` (action id -> the attempt its run
        requested last, None when not known), all of them capability's; how many were
        deleted. With ``exact``, only that attempt's request goes (a timed-out attempt: a
        retry may be queued already); else every attempt's (an action cancelled). A
        request whose sequence is known here is deleted by it; the others are looked for
        in one scan of the capability's queue. ``never_taken`` is given the (action id,
        attempt) of those deleted that no worker had been handed (a request being worked
        on is in the queue until its worker acknowledges it). Best effort: a failure is
        logged, never raised."""
        try:
            found: list[tuple[str, int, int]] = []
            unknown: dict[str, int | None] = {}
            for action_id, attempt in requests.items():
                seq = self._known(action_id, attempt)
                if seq is None or attempt is None:
                    unknown[action_id] = attempt if exact else None
                else:
                    found.append((action_id, attempt, seq))
            if unknown:
                found += await self._look_for(capability, unknown)
            deleted: list[tuple[str, int, int]] = []
            for request in found:
                try:
                    if await self._js.delete_msg(self._subjects.tasks_stream, request[2]):
                        deleted.append(request)
                except APIError as exc:
                    if not _taken_already(exc):
                        raise
            if never_taken is not None and deleted:
                handed = await self._handed(capability)
                never_taken += [(a, n) for a, n, seq in deleted if seq > handed]
        # Best effort: a request left queued is refused when an agent answers it.
        except Exception as exc:  # noqa: BLE001
            log.warning("could not take the requests of %s out of the queue: %s", requests, exc)
            return 0
        return len(deleted)

    async def _handed(self, capability: str) -> int:
        """The last sequence the capability's consumer has handed to a worker (read after
        a delete: a request deleted past it is handed to none); 0: no consumer yet; a
        failure to read it counts every request as handed."""
        try:
            info = await self._js.consumer_info(
                self._subjects.tasks_stream, consumer_name(capability)
            )
        except NotFoundError:
            return 0
        # Counted as handed: their slots are then held the while a stop may take.
        except Exception:
            log.debug("could not read the consumer of %s", capability, exc_info=True)
            return 1 << 62
        return int(info.delivered.stream_seq or 0)

    def _known(self, action_id: str, attempt: int | None) -> int | None:
        """The sequence of the attempt's request if dispatched here (forgotten now)."""
        attempts = self._seqs.get(action_id)
        if attempts is None or attempt is None:
            return None
        seq = attempts.pop(attempt, None)
        if not attempts:
            del self._seqs[action_id]
        return seq

    async def _look_for(
        self, capability: str, actions: Mapping[str, int | None]
    ) -> list[tuple[str, int, int]]:
        """The queued requests of ``actions`` (action id -> its attempt, None: any
        attempt), each (action id, attempt, sequence). The lookups of one capability that
        come while its queue is being scanned wait and share the next scan: many cancels at
        once cost a scan or two of the queue, not one each."""
        scan = self._next.get(capability)
        if scan is None:
            scan = self._next[capability] = _Scan()
            scan.task = asyncio.create_task(self._scan_in_turn(capability, scan))
        for action_id, attempt in actions.items():
            scan.wanted.setdefault(action_id, set()).add(attempt)
        assert scan.task is not None
        found = await asyncio.shield(scan.task)
        return [
            (action_id, attempt, seq)
            for action_id, only in actions.items()
            for attempt, seq in found.get(action_id, ())
            if only is None or attempt == only
        ]

    async def _scan_in_turn(self, capability: str, scan: _Scan) -> dict[str, list[tuple[int, int]]]:
        lock = self._scanning.setdefault(capability, asyncio.Lock())
        async with lock:
            if self._next.get(capability) is scan:
                del self._next[capability]  # lookups from now on wait for the next scan
            return await self._scan(capability, scan.wanted)

    async def _scan(
        self, capability: str, actions: Mapping[str, set[int | None]]
    ) -> dict[str, list[tuple[int, int]]]:
        """Action id -> (attempt, sequence) of each queued request of ``actions`` (with an
        attempt wanted, or None: any)."""
        self.scans += 1
        subject = self._subjects.capability(capability)
        stream = self._subjects.tasks_stream
        found: dict[str, list[tuple[int, int]]] = {}
        last = 0

        def note(seq: int, headers: Mapping[str, str]) -> None:
            action_id, _, attempt = headers.get(MSG_ID_HEADER, "").rpartition(".")
            wanted = actions.get(action_id)
            if wanted and attempt.isdigit() and (None in wanted or int(attempt) in wanted):
                found.setdefault(action_id, []).append((int(attempt), seq))

        async for batch in scan_headers(connection(self._js), stream, subject):
            for seq, headers in batch:
                last = seq
                note(seq, headers)
        # What the leader stored after the last request the scan saw (a replica that
        # answered the direct gets may be behind it).
        while True:
            try:
                msg = await self._js.get_msg(stream, last + 1, subject=subject, next=True)
            except NotFoundError:
                return found
            last = int(msg.seq or 0)
            note(last, msg.headers or {})


@dataclass(slots=True)
class _Scan:
    """A scan of one capability's queue to come: what it looks for, and its task."""

    wanted: dict[str, set[int | None]] = field(default_factory=dict)
    task: asyncio.Task[dict[str, list[tuple[int, int]]]] | None = None
