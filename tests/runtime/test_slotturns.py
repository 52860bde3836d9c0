"""Which changes of a slots entry go in the next write: those that take or hand on a slot
before runs entering a long line, never for more than a few writes in a row."""

from __future__ import annotations

import asyncio

from interlock.runtime.slotturns import MAX_DEFERRED, urgent_first


async def test_urgent_changes_go_first_and_the_others_wait_a_few_writes_at_most() -> None:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(4)]
    batch = list(zip("abcd", futures, strict=True))
    urgent = {futures[1], futures[3]}
    now, later = urgent_first(batch, urgent, 0)
    assert [name for name, _ in now] == ["b", "d"]
    assert [name for name, _ in later] == ["a", "c"]
    assert urgent == set()  # told once
    # Nothing urgent, or everything: all in one write.
    assert urgent_first(batch, set(), 0) == (batch, [])
    assert urgent_first(batch, set(futures), 0) == (batch, [])
    # Left behind MAX_DEFERRED writes in a row: everything goes, in the order asked.
    assert urgent_first(batch, {futures[1]}, MAX_DEFERRED) == (batch, [])
