"""RunWatcher: a subscription's hint is only a hint, and a wait still reads the log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from nats.aio.client import Client

import interlock
from interlock.client import reading
from interlock.core import events as ev
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.logstore import MemoryRunLog, RunLog
from interlock.runtime.waiting import READERS, RunWatcher
from interlock.transport.subjects import Subjects
from support.runtime import GATED, TIMEOUT, connect


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


def wait_stopped(pid: int) -> None:
    """Until every thread of ``pid`` is in the stopped state (``T`` in /proc), at most 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that has just ended
                # The state follows the command's closing parenthesis: "pid (comm) T ...".
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within 5 s")


@contextlib.contextmanager
def paused(server: EmbeddedNats) -> Iterator[None]:
    """The server stopped (SIGSTOP) meanwhile: it answers nothing until resumed.

    ``kill`` returns once the signal is queued, while a thread of the server may still be
    running on another core and answer a request sent just after: wait until every thread
    of the process is seen stopped."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    wait_stopped(server.pid)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


async def test_reads_not_answered_in_time_are_asked_again_within_the_waits_deadline(
    tmp_path: Path, subjects: Subjects
) -> None:
    """A wait's read that times out is asked again until the wait's own deadline, with
    at most ``asking`` reads in flight: a process too busy to take in thousands of answers
    within a read's timeout ends no wait that still has time.

    The server is paused while 300 waits start (each read then times out, again and again);
    once it resumes, every wait gets its run's result."""
    n, asking = 300, 256
    with EmbeddedNats(tmp_path) as server:
        async with await interlock.Client.connect(server.url, prefix=subjects.prefix) as client:
            await client.apply([("gated.yaml", GATED)])
            run_ids = [await client.start("gated", {}, run_id=f"p{i}") for i in range(n)]
            for run_id in run_ids:
                await client.cancel(run_id, f"reason {run_id}")
        nc = await connect(server.url)
        watcher = RunWatcher(nc, subjects, RunLog(nc, subjects), read_timeout=0.2, asking=asking)
        await watcher.start()
        in_flight = []  # requests awaiting an answer, as the connection counts them
        with paused(server):
            waits = [asyncio.create_task(watcher.finished(r, 120)) for r in run_ids]
            for _ in range(int(60 / 0.02)):
                in_flight.append(len(nc._resp_map))
                if watcher.timed_out_reads >= 2 * n:
                    break
                assert not any(wait.done() for wait in waits)
                await asyncio.sleep(0.02)
        assert watcher.timed_out_reads >= 2 * n  # every wait has asked more than once
        assert max(in_flight) == asking
        results = await asyncio.wait_for(asyncio.gather(*waits), TIMEOUT * 3)
        reasons = [ev.record_type(records[-1]) for records in results]
        assert reasons == ["io.interlock.run.cancelled"] * n
        await watcher.close()
        await nc.close()


async def test_a_wait_whose_reads_time_out_ends_at_its_own_deadline(
    tmp_path: Path, subjects: Subjects
) -> None:
    """Reads that are never answered are asked again only until the wait's deadline: the
    wait then ends as any wait on a run that did not finish in time."""
    with EmbeddedNats(tmp_path) as server:
        async with await interlock.Client.connect(server.url, prefix=subjects.prefix) as client:
            await client.apply([("gated.yaml", GATED)])
            run_id = await client.start("gated", {}, run_id="never-answered")
        nc = await connect(server.url)
        watcher = RunWatcher(nc, subjects, RunLog(nc, subjects), read_timeout=0.05)
        await watcher.start()
        with paused(server):
            try:
                await asyncio.wait_for(watcher.finished(run_id, 0.5), TIMEOUT)
            except TimeoutError as exc:
                assert str(exc) == "run never-answered has not finished after 0.5s"  # noqa: PT017
            else:
                raise AssertionError("the wait ended without its run")
            assert not await watcher.exists(run_id, 0.3)
        await watcher.close()
        await nc.close()
