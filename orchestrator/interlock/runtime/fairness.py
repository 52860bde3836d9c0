"""Costly evaluations shared fairly: one thread, served lane by lane in turn.

The orchestrator evaluates costly expressions (a comprehension, an event of many values:
trigger ``input`` templates, ``correlate.events`` keys, the decisions of workflows whose
expressions may loop) on one thread of their own, so that the event loop serves every
other run meanwhile. Served first come first served, one publisher's flood of such events
held everybody else's behind it (600 events in half a second delayed another publisher's
triggered run by 84 s). So each evaluation goes in a *lane*, and the thread takes one from
each waiting lane in turn: an evaluation waits behind at most one of each other lane,
however long another lane's queue is.

The lanes of inbound events are the publishers' (:func:`publisher_lane`); a run's
decisions are in its workflow's lane. The ingress also stops taking a publisher's events
once its lane holds ``PUBLISHER_BUDGET`` evaluations (they go back to JetStream for about
as long as the lane takes to drain), so that what the consumer holds in hand is not one
party's flood either.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Final, TypeVar

from interlock.transport.subjects import Subjects

T = TypeVar("T")

PUBLISHER_BUDGET: Final = 32
"""Costly evaluations a publisher's lane may hold (waiting or running) before the ingress
defers that publisher's further events."""
DEFER_MIN_S: Final = 0.05
DEFER_MAX_S: Final = 5.0
"""Bounds of how long a deferred event stays back in JetStream before it is delivered
again: about as long as its publisher's lane takes to drain (what is in it, at the
thread's recent pace), spread by a random half either way so that the deferred events do
not all come back at once."""


class Deferred(Exception):
    """An inbound event whose publisher's lane is full: it goes back to JetStream for
    ``delay`` seconds and is taken again then (not an error: it waits its turn)."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"deferred {delay:.2f} s")
        self.delay = delay


def publisher_lane(subjects: Subjects, subject: str) -> str:
    """The lane of an inbound event, from the subject it came on: who published it, as far
    as the orchestrator can tell.

    JetStream keeps no publisher with a message, so this is the first two words of the
    event's type (``com.acme`` for ``com.acme.build.done``): publishers are granted type
    patterns (``com.acme.>``), so a publisher has one lane however it varies its types
    within them, and another publisher's events are in another. Events addressed to a run
    (only the operator, the gateway and the orchestrator publish those) share one lane.
    One function decides it, so that it can become the publishing account once the server
    attests one.
    """
    route = subjects.inbound_route(subject)
    if route is None:
        return "publisher:?"
    run_id, event_type = route
    if run_id is not None:
        return "addressed"
    return "publisher:" + ".".join(event_type.split(".", 2)[:2])


class FairLanes:
    """Work run on ``executor`` one item at a time, the waiting lanes served in turn."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._lanes: OrderedDict[str, deque[tuple[Callable[[], Any], asyncio.Future[Any]]]] = (
            OrderedDict()
        )
        self._running: str | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._pace = 0.01
        """Seconds an item has taken lately (a moving average)."""

    def defer(self, lane: str) -> Deferred:
        """A deferral of an event of ``lane`` for about as long as the lane takes to drain."""
        estimate = self.pending(lane) * self._pace * (0.5 + random.random())
        return Deferred(min(max(estimate, DEFER_MIN_S), DEFER_MAX_S))

    def pending(self, lane: str) -> int:
        """Items of ``lane`` waiting or running."""
        waiting = self._lanes.get(lane)
        return (len(waiting) if waiting else 0) + (self._running == lane)

    async def run(self, work: Callable[[], T], lane: str) -> T:
        """``work()`` on the executor, in its turn among the lanes; its result."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._lanes.setdefault(lane, deque()).append((work, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._lanes:
                # The lane first in line gives one item and goes to the back of the line.
                lane, waiting = self._lanes.popitem(last=False)
                work, future = waiting.popleft()
                if waiting:
                    self._lanes[lane] = waiting
                if future.done():  # its caller is gone
                    continue
                self._running = lane
                began = time.monotonic()
                try:
                    result = await loop.run_in_executor(self._executor, work)
                except Exception as exc:  # noqa: BLE001 - the caller's to handle
                    if not future.done():
                        future.set_exception(exc)
                else:
                    if not future.done():
                        future.set_result(result)
                finally:
                    self._running = None
                    self._pace += (time.monotonic() - began - self._pace) / 8
        except asyncio.CancelledError:
            for waiting in self._lanes.values():
                for _, future in waiting:
                    future.cancel()
            self._lanes.clear()
            raise
