"""RunWatcher: a subscription's hint is only a hint, and a wait still reads the log."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from interlock.core import events as ev
from interlock.runtime.logstore import MemoryRunLog
from interlock.runtime.waiting import RunWatcher
from interlock.transport.subjects import Subjects


def entered(run_id: str) -> ev.StateEntered:
    return ev.StateEntered(
        specversion="1.0",
        id=f"{run_id}:1",
        source=ev.SOURCE,
        subject=run_id,
        time="2026-11-01T00:00:00.000Z",
        datacontenttype="application/json",
        data=ev.StateEnteredData(state="s"),
    )


class WatchedLog(MemoryRunLog):
    """The in-memory log, saying when it has been read."""

    def __init__(self) -> None:
        super().__init__()
        self.read_once = asyncio.Event()

    async def read_raw(self, run_id: str, after: int = 0) -> list[tuple[int, bytes]]:
        try:
            return await super().read_raw(run_id, after)
        finally:
            self.read_once.set()


async def test_a_hint_seen_before_the_log_holds_its_message_is_read_again_soon(
    nc: Client, subjects: Subjects
) -> None:
    # A subscriber can see an append a moment before the stream has stored it. The follow
    # must read again soon, not only at its next recheck (30 s here).
    log = WatchedLog()
    watcher = RunWatcher(nc, subjects, log)  # type: ignore[arg-type]
    run_id = "r-early-hint"
    follow = watcher.follow(run_id)
    first = asyncio.ensure_future(anext(follow))
    await asyncio.wait_for(log.read_once.wait(), 5)  # it has read the (empty) log, listening
    await nc.publish(subjects.run(run_id), b"the append, as subscribers see it")
    await nc.flush()
    # The hint has reached the watcher (a round trip after it) and found nothing to read.
    await nc.flush()
    await log.append(run_id, [entered(run_id)], 0)
    seq, payload = await asyncio.wait_for(first, 5)
    assert seq == 1
    assert [ev.record_type(r) for r in ev.decode_batch(payload)] == ["io.interlock.state.entered"]
    await watcher.close()
