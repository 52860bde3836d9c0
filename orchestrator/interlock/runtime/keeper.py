"""One message in the task requests' stream that no agent takes: its last block kept.

The task requests' stream is a work queue: a task is removed once its agent acknowledges
it. nats-server's file store removes a block file once its last message is gone, and when
that block is the stream's last it opens a new one at once. Runs that come one at a time
drain the queue after every task, so each task cost the server a block file made and
removed (an ``openat``, a write, an ``unlinkat``): about a third of the server's CPU per
task in a loop of publish, fetch and acknowledge, and 10 to 25% of the milliseconds of a
run of the benchmarks' approval workflow made one after another (docs/performance.md,
"CPU per run").

A message on ``Subjects.tasks_keeper``, a subject of the stream no consumer reads, keeps
the last block from ever draining. The server starts a new block once the last one is
full, where the keeper is no longer, so the keeper is written again every ``EVERY_S``
seconds while tasks are dispatched, and the subject is then purged but for its newest
message, so it holds one however many orchestrator replicas write it. Not by
``Nats-Rollup: sub``: the stream takes no rollups, since one message stored there with
``Nats-Rollup: all`` (a copy a direct get writes where its requester says, say) would drop
every queued task. Only the orchestrator may publish on that subject and purge the stream
(the other roles' permissions do not reach them). Losing the keeper costs nothing but the
server's work it saves, so a write that fails is logged and tried again at the next turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.client import Client

from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.keeper")

EVERY_S = 10.0
"""Seconds between writes of the keeper while tasks are dispatched."""


class TaskQueueKeeper:
    """Writes the keeper when started, then every ``every`` seconds in which
    ``dispatched()`` (a count of tasks dispatched) has moved."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        dispatched: Callable[[], int],
        *,
        every: float = EVERY_S,
    ) -> None:
        self._js = jetstream(nc)
        self._stream = subjects.tasks_stream
        self._subject = subjects.tasks_keeper
        self._dispatched = dispatched
        self._every = every
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        """Keepers written (and acknowledged) by this process."""
        self.turns = 0
        """Turns of the loop (each looks at the count of tasks dispatched)."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        seen: int | None = None
        while True:
            count = self._dispatched()
            if count != seen and await self._write():
                seen = count
            self.turns += 1
            await asyncio.sleep(self._every)

    async def _write(self) -> bool:
        try:
            await self._js.publish(self._subject, b"")
            await self._js.purge_stream(self._stream, subject=self._subject, keep=1)
        # Best effort: without it the server only works harder.
        except Exception as exc:  # noqa: BLE001
            log.debug("could not write the task queue's keeper: %s", exc)
            return False
        self.written += 1
        return True
