"""A worker's handler slots, shared by the pull consumers of its capabilities."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable


class SlotPool:
    """A worker's free handler slots, handed out first come, first served.

    Messages handled at once never exceed the pool's size. A consumer pulls for the slots
    it reserved; with none free (more consumers than slots), for one message unreserved,
    which takes a slot when it comes (a free one, or one reclaimed from a request nothing
    came for) or else goes back to the stream (nak).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"concurrency must be at least 1, got {size}")
        self.size = size
        self._free = size
        self._waiters: collections.deque[tuple[int, asyncio.Future[int]]] = collections.deque()
        self._reclaimers: list[Callable[[bool], bool]] = []

    def add_reclaimer(self, reclaim: Callable[[bool], bool]) -> None:
        """``reclaim(also_busy)`` gives back slots held idle (a pull request nothing came
        for) when asked, those of a consumer that had work before only if ``also_busy``;
        it returns whether it did. Asked when a slot is wanted and none is free."""
        self._reclaimers.append(reclaim)

    def _reclaimed(self, enough: Callable[[], bool]) -> bool:
        """Ask the reclaimers, those of consumers without work first, until ``enough``."""
        for also_busy in (False, True):
            for reclaim in self._reclaimers:
                if enough():
                    return True
                reclaim(also_busy)
        return enough()

    @property
    def free(self) -> int:
        return self._free

    @property
    def used(self) -> int:
        return self.size - self._free

    async def acquire(self, want: int, *, urgent: bool = False) -> int:
        """Wait for at least one free slot; take up to ``want`` and return how many.

        ``urgent``: the caller has had work and may have more; slots other consumers hold
        idle are reclaimed for it rather than waiting for their pull requests to expire.
        """
        got = self.take(want)
        if got:
            return got
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (want, fut)
        self._waiters.append(entry)
        if urgent:
            self._reclaimed(fut.done)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
            raise

    def try_acquire(self) -> bool:
        """Take one slot if one is free right now."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    def take(self, want: int) -> int:
        """Take up to ``want`` slots free right now, none when others wait for them."""
        if self._free > 0 and not self._waiters:
            got = min(want, self._free)
            self._free -= got
            return got
        return 0

    def acquire_now(self) -> bool:
        """Take one slot for a message that has arrived: a free one, else one reclaimed
        from a pull request that nothing has come for (False: every slot is at work)."""
        return self.try_acquire() or self._reclaimed(self.try_acquire)

    def release(self, n: int = 1) -> None:
        if n <= 0:
            return
        self._free = min(self.size, self._free + n)
        while self._waiters and self._free > 0:
            want, fut = self._waiters.popleft()
            if fut.done():
                continue
            got = min(want, self._free)
            self._free -= got
            fut.set_result(got)
