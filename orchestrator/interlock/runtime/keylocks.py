"""One change at a time per key within one process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class KeyLocks:
    """A lock per key, kept only while someone holds or waits for it.

    The ingress takes the events of a batch together: those of one key would each lose
    their compare-and-set of the key's entry to the others. Taken one at a time here,
    only other processes race by revision."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def locked(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
