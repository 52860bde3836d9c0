"""The run index as the gateway lists it: pages read from the server, nothing kept.

``GET /runs`` pages through the index by its listing keys (:mod:`interlock.runtime.
runlisting`): the server selects the runs of a workflow and/or status by subject filter and
counts them, so a page costs a few requests whatever the count of runs, and the gateway
keeps none of them. A page is read from the stream's leader when it is asked for: never
older than the bucket was then. ``GET /live/runs`` is fed by one subscription on the
entries' writes from the moment the first follower came (new writes only, not the index so
far): the gateway's account imports them as a stream, and makes no consumer. What was
written while the connection was down is not heard: the first write heard after a
reconnection tells every follower to list again first. (A gateway credential of the
orchestrator's own account, issued before gateways had one of their own, follows with an
ordered consumer, as it did.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from interlock.gateway.problems import Problem
from interlock.runtime.foreign import index_entry
from interlock.runtime.runlisting import Keep, RunPages
from interlock.transport.jetstream import connection
from interlock.transport.natsclient import JS_API, js_api
from interlock.transport.subjects import Subjects
from interlock.views import RunSummary, summary_from_index

log = logging.getLogger("interlock.gateway")

WATCH_QUEUE = 1000
"""Changes held for one follower of ``changes`` before it is told it fell behind."""
ALL = 1 << 31
FILTERED_MAX = 20_000
"""The most entries of the run index one page narrowed by ``waiting``, ``since`` or
``until`` reads (past it: 422 ``filter-too-wide``)."""
"""A limit no listing reaches."""

Changes = asyncio.Queue[tuple[str, dict[str, Any] | None] | None]
"""What a follower of the run index is given (see :meth:`RunList.follow`)."""


class RunList:
    """The run index listed as ``Client.runs`` lists it, a page at a time."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._pages = RunPages(connection(js), subjects)
        self._sub: Any = None
        self._watchers: set[Changes] = set()
        self._following = asyncio.Lock()
        self._reconnects = 0
        """The connection's reconnections when the last write was heard."""

    async def page(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        offset: int = 0,
        limit: int = 50,
        keep: Callable[[list[RunSummary]], Awaitable[list[RunSummary]]] | None = None,
    ) -> tuple[list[RunSummary], bool]:
        """Up to ``limit`` runs after the first ``offset``, newest first, and whether more
        follow; ``keep`` narrows each chunk read (since, until, waiting)."""

        examined = 0

        async def summaries(items: list[dict[str, Any]]) -> list[Any]:
            nonlocal examined
            examined += len(items)
            if examined > FILTERED_MAX:
                # What the index cannot select is read entry by entry: a filter nothing
                # matches read every entry of the index at each request.
                raise Problem(
                    422,
                    "filter-too-wide",
                    f"the page needs more than {FILTERED_MAX:,} runs read one by one "
                    "(waiting, since and until are checked run by run): narrow it with "
                    "workflow= or status=, which the index selects, or a lower offset",
                    max_examined=FILTERED_MAX,
                )
            found = [summary_from_index(i) for i in items]
            return await keep(found) if keep is not None else found

        narrowed: Keep | None = summaries if keep is not None else None
        found, more = await self._pages.page(
            workflow=workflow, status=status, offset=offset, limit=limit, keep=narrowed
        )
        return [f if isinstance(f, RunSummary) else summary_from_index(f) for f in found], more

    async def runs(
        self, *, workflow: str | None = None, status: str | None = None, limit: int = ALL
    ) -> list[RunSummary]:
        """The newest ``limit`` runs (all: every one, read a chunk at a time)."""
        return (await self.page(workflow=workflow, status=status, limit=limit))[0]

    async def counts(self, workflow: str) -> dict[int, dict[str, int]]:
        """Runs of ``workflow`` per version and status, counted a chunk at a time."""
        counts: dict[int, dict[str, int]] = {}

        async def count(items: list[dict[str, Any]]) -> list[Any]:
            for run in items:
                by_status = counts.setdefault(int(run.get("version", 0) or 0), {})
                status = str(run.get("status", ""))
                by_status[status] = by_status.get(status, 0) + 1
            return []

        await self._pages.page(workflow=workflow, limit=ALL, keep=count)
        return counts

    # -- following --------------------------------------------------------------------------

    async def follow(self) -> Changes:
        """A queue of each run index entry written from now on: (run id, the entry) or
        (run id, None) when deleted; None once, when the follower fell behind
        (``WATCH_QUEUE`` changes not taken) and was dropped. Give it back with
        :meth:`unfollow`."""
        async with self._following:
            if self._sub is None:
                bucket = self._subjects.runs_bucket
                nc = connection(self._js)
                if js_api(nc) == JS_API:
                    self._sub = await self._js.subscribe(
                        f"$KV.{bucket}.*",
                        stream=f"KV_{bucket}",
                        ordered_consumer=True,
                        config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
                        cb=self._changed,
                    )
                else:
                    self._reconnects = nc.stats["reconnects"]
                    self._sub = await nc.subscribe(f"$KV.{bucket}.*", cb=self._heard)
        queue: Changes = asyncio.Queue(WATCH_QUEUE)
        self._watchers.add(queue)
        return queue

    async def _heard(self, msg: Msg) -> None:
        """A write heard on the imported subjects: after a reconnection, every follower
        is first told it may have missed some."""
        reconnects = connection(self._js).stats["reconnects"]
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            for queue in list(self._watchers):
                self._watchers.discard(queue)
                if queue.full():
                    queue.get_nowait()
                queue.put_nowait(None)
        await self._changed(msg)

    async def _changed(self, msg: Msg) -> None:
        key = msg.subject.rsplit(".", 1)[1]
        operation = (msg.headers or {}).get("KV-Operation")
        item = None
        if operation not in ("DEL", "PURGE") and msg.data:
            # Not an entry the orchestrator wrote: reported, and told as gone.
            item = index_entry(self._subjects.runs_bucket, key, msg.data)
        self._tell(key, item)

    def _tell(self, key: str, item: dict[str, Any] | None) -> None:
        for queue in list(self._watchers):
            try:
                queue.put_nowait((key, item))
            except asyncio.QueueFull:
                # A watcher that does not keep up is told once, and left to list again.
                self._watchers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)

    def unfollow(self, queue: Changes) -> None:
        self._watchers.discard(queue)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
