"""One call under way at a time, shared by every caller that comes while it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedCall(Generic[T]):
    """Calls ``call()`` for whoever asks, once at a time: a caller that comes while a call
    is under way waits for that one (many misses at once cost one read); one that comes
    after it ended starts the next.

    A call that has ended is never waited for again, even before its end has been seen by
    anyone: an ended task's done-callbacks run only at the loop's next turn, and a caller
    looping until a call started after some moment (``while read_from < since``) that
    got the ended one back would go round without ever giving the loop that turn (awaiting
    a finished future does not suspend), holding the whole process (its consumers, its
    leases, its signal handlers) for good.
    """

    def __init__(self, call: Callable[[], Awaitable[T]]) -> None:
        self._call = call
        self._running: asyncio.Future[T] | None = None

    async def __call__(self) -> T:
        """The result of the call under way, else of a new one (a cancellation of the
        caller does not cancel the call: the others still wait for it)."""
        running = self._running
        if running is None or running.done():
            running = self._running = asyncio.ensure_future(self._call())
        return await asyncio.shield(running)
