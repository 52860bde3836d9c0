"""The run index as the gateway lists it: kept in memory by one watch of its bucket.

``GET /runs`` pages through the index newest first. Reading the whole bucket for every page
costs in proportion to the runs kept (a second and more at 10,000 runs on a busy machine);
the gateway instead keeps the index in memory, fed by a watch of the bucket, and answers a
page by filtering it. Before answering it looks up the bucket's newest revision (one
request) and waits until the watch has applied it, so a page is never older than the bucket
was when it was asked for: what a full read would have given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from interlock.runtime.foreign import index_entry
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.kvread import newest_revision
from interlock.transport.subjects import Subjects
from interlock.views import RunSummary, summary_from_index

log = logging.getLogger("interlock.gateway")

CATCH_UP_S = 5.0
"""Longest wait for the watch to reach the bucket's newest revision."""
WATCH_QUEUE = 1000
"""Changes held for one follower of ``changes`` before it is told it fell behind."""

Changes = asyncio.Queue[tuple[str, dict[str, Any] | None] | None]
"""What a follower of the run index is given (see :meth:`RunList.follow`)."""


class RunList:
    """The run index in memory, listed as ``Client.runs`` lists it."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._kv: KeyValue | None = None
        self._items: dict[str, dict[str, Any]] = {}
        self._applied = 0
        self._moved = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        """Set by :meth:`stop`: the watch ends at its next turn (even if its cancellation
        was lost)."""
        self._watchers: set[Changes] = set()

    async def runs(
        self, *, workflow: str | None = None, status: str | None = None
    ) -> list[RunSummary]:
        """Runs newest first: all, or of one ``workflow`` (``name`` or ``namespace/name``)
        and/or ``status``."""
        try:
            if self._kv is None:
                self._kv = await self._js.key_value(self._subjects.runs_bucket)
            newest = await newest_revision(self._kv)
        except (BucketNotFoundError, NotFoundError):
            return []
        if newest is None:
            return []
        await self._caught_up(newest)
        out = [
            item
            for item in self._items.values()
            if (
                not workflow
                or workflow
                in (item.get("workflow"), f"{item.get('namespace')}/{item.get('workflow')}")
            )
            and (not status or item.get("status") == status)
        ]
        out.sort(key=lambda i: str(i.get("started_at", "")))
        out.reverse()
        return [summary_from_index(i) for i in out]

    async def _caught_up(self, revision: int) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow())
        deadline = asyncio.get_running_loop().time() + CATCH_UP_S
        while self._applied < revision:
            self._moved.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or self._task.done():
                raise nats.errors.TimeoutError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), left)

    async def _follow(self) -> None:
        assert self._kv is not None
        watcher = await self._kv.watchall()
        try:
            while not self._stopping:
                try:
                    entry = await watcher.updates(timeout=3600.0)  # type: ignore[no-untyped-call]
                except nats.errors.TimeoutError:
                    continue
                if entry is None:
                    continue
                if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                    self._items.pop(entry.key, None)
                    self._tell(entry.key, None)
                else:
                    item = index_entry(
                        self._subjects.runs_bucket, entry.key, entry.value, entry.revision or 0
                    )
                    if item is None:  # not an entry the orchestrator wrote (reported)
                        self._items.pop(entry.key, None)
                        self._tell(entry.key, None)
                    else:
                        self._items[entry.key] = item
                        self._tell(entry.key, item)
                if entry.revision is not None:
                    self._applied = max(self._applied, entry.revision)
                self._moved.set()
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _tell(self, key: str, item: dict[str, Any] | None) -> None:
        for queue in list(self._watchers):
            try:
                queue.put_nowait((key, item))
            except asyncio.QueueFull:
                # A watcher that does not keep up is told once, and left to list again.
                self._watchers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)

    async def follow(self) -> Changes:
        """A queue of each run index entry written from now on (the watch caught up
        first): (run id, the entry) or (run id, None) when deleted; None once, when the
        follower fell behind (``WATCH_QUEUE`` changes not taken) and was dropped. Give it
        back with :meth:`unfollow`."""
        await self.runs()
        if self._kv is not None and (self._task is None or self._task.done()):
            # An empty index is not watched by runs(): watch it now.
            self._task = asyncio.create_task(self._follow())
        queue: Changes = asyncio.Queue(WATCH_QUEUE)
        self._watchers.add(queue)
        return queue

    def unfollow(self, queue: Changes) -> None:
        self._watchers.discard(queue)

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._task)
