"""RunWatcher: a subscription's hint is only a hint, and a wait still reads the log."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from nats.aio.client import Client

from interlock.client import reading
from interlock.core import events as ev
from interlock.runtime.logstore import MemoryRunLog
from interlock.runtime.waiting import READERS, RunWatcher
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


class GatedLog(MemoryRunLog):
    """The in-memory log, whose reads wait until ``opened`` and which counts the reads
    under way at once."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()
        self.started: asyncio.Queue[str] = asyncio.Queue()
        self.reading = self.most = 0

    async def read_raw(self, run_id: str, after: int = 0) -> list[tuple[int, bytes]]:
        self.reading += 1
        self.most = max(self.most, self.reading)
        self.started.put_nowait(run_id)
        try:
            await self.opened.wait()
            return await super().read_raw(run_id, after)
        finally:
            self.reading -= 1


async def test_following_logs_reads_them_first_within_the_watchers_bound(
    nc: Client, subjects: Subjects
) -> None:
    # More logs followed at once than the watcher reads at once: their first reads (of the
    # whole log) wait for a free read too, as the follows' own reads do.
    log = GatedLog()
    watcher = RunWatcher(nc, subjects, log)  # type: ignore[arg-type]
    ops = SimpleNamespace(log=log, watcher=watcher)  # what the client's reads use
    run_ids = [f"r-bound-{n}" for n in range(READERS + 8)]
    for run_id in run_ids:
        await log.append(run_id, [entered(run_id)], 0)
    follows = [
        reading.logs(ops, run_id, follow=True, tail=None, since=None)  # type: ignore[arg-type]
        for run_id in run_ids
    ]
    firsts = [asyncio.ensure_future(anext(follow)) for follow in follows]
    for _ in range(READERS):
        await asyncio.wait_for(log.started.get(), 5)
    log.opened.set()
    first_records = await asyncio.wait_for(asyncio.gather(*firsts), 5)
    assert [record.subject for record in first_records] == run_ids
    assert log.most == READERS  # never more reads at once, and that many
    for follow in follows:
        await follow.aclose()
    await watcher.close()
