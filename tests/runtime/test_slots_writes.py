"""The slots bucket's writes: what one take and one free of a limit cost in round trips,
and that the revisions a process keeps never let it write over another's change."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.core import events as ev
from interlock.runtime import slotlines
from interlock.runtime.concurrency import Slots
from interlock.transport.connection import ConnectOptions
from interlock.transport.connection import connect as connect_client
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects

CLAIM = ev.SlotClaim(limit="cap:review", key="", size=2)
SINCE = "2026-12-05T03:00:00.000Z"


async def _client(nats_url: str) -> Client:
    return await connect_client(ConnectOptions(servers=[nats_url]))


async def _reads(nc: Client, subjects: Subjects) -> list[Msg]:
    """Every read of the slots bucket's keys from now on (the requests, seen by a plain
    subscriber of the JetStream API subjects a key's read goes to)."""
    stream = f"KV_{subjects.slots_bucket}"
    seen: list[Msg] = []

    async def note(msg: Msg) -> None:
        seen.append(msg)

    watched = [
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.STREAM.MSG.GET.{stream}",
    ]
    for subject in watched:
        await nc.subscribe(subject, cb=note)
    await nc.flush()
    return seen


async def test_a_limit_that_empties_and_fills_again_is_written_without_a_read(
    nats_url: str, subjects: Subjects
) -> None:
    nc, watcher = await _client(nats_url), await _client(nats_url)
    try:
        await provision(nc, subjects)
        slots = Slots(nc, subjects)
        assert (await slots.enter(CLAIM, "r1/review#1", SINCE)).held
        assert await slots.release(CLAIM, "r1/review#1") == []
        assert await slots.read(CLAIM.limit, CLAIM.key) is None  # deleted: nobody holds
        reads = await _reads(watcher, subjects)
        for n in range(2, 6):  # each request alone, as sequential runs make them
            assert (await slots.enter(CLAIM, f"r{n}/review#1", SINCE)).held
            assert await slots.release(CLAIM, f"r{n}/review#1") == []
        await nc.flush()
        await watcher.flush()
        assert reads == [], [m.subject for m in reads]
    finally:
        await nc.close()
        await watcher.close()


async def test_a_delete_known_here_and_overtaken_elsewhere_is_read_again_and_both_hold(
    nats_url: str, subjects: Subjects
) -> None:
    first_nc, second_nc = await _client(nats_url), await _client(nats_url)
    try:
        await provision(first_nc, subjects)
        first, second = Slots(first_nc, subjects), Slots(second_nc, subjects)
        assert (await first.enter(CLAIM, "a/x#1", SINCE)).held
        assert await first.release(CLAIM, "a/x#1") == []  # first knows the delete marker
        assert (await second.enter(CLAIM, "b/x#1", SINCE)).held  # written over it elsewhere
        # first's known revision is stale: its write is refused, read again and done again.
        assert (await first.enter(CLAIM, "c/x#1", SINCE)).held
        entry = await second.read(CLAIM.limit, CLAIM.key)
        assert entry is not None
        assert sorted(h.run_id for h in entry.holders) == ["b/x#1", "c/x#1"]
        # Full now (limit 2): neither process gives a third slot, whatever it knew.
        entered = await asyncio.gather(
            first.enter(CLAIM, "d/x#1", SINCE), second.enter(CLAIM, "e/x#1", SINCE)
        )
        assert [e.held for e in entered] == [False, False]
        assert await second.release(CLAIM, "b/x#1") == ["d/x#1"]
        entry = await first.read(CLAIM.limit, CLAIM.key)
        assert entry is not None
        assert sorted(h.run_id for h in entry.holders) == ["c/x#1", "d/x#1"]
    finally:
        await first_nc.close()
        await second_nc.close()


async def test_a_slot_handed_on_from_a_line_rewrites_the_entry_alone(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first waiters of a line are kept in the entry: handing a slot to one writes one
    key (a plain compare-and-set, not an atomic batch, which the server stores far more
    slowly); the line's next waiters move into the entry when its head is taken from a
    segment, which is written then anyway. The order of the line is kept across both."""
    monkeypatch.setattr(slotlines, "HEAD", 2)
    monkeypatch.setattr(slotlines, "SEGMENT", 3)
    one = ev.SlotClaim(limit="wf", key="all", size=1, fair="acme")
    nc = await _client(nats_url)
    try:
        await provision(nc, subjects)
        js = nc.jetstream()
        stream = f"KV_{subjects.slots_bucket}"

        async def stored() -> int:
            return int((await js.stream_info(stream)).state.last_seq)

        slots = Slots(nc, subjects)
        runs = [f"r{n}" for n in range(8)]
        for n, run_id in enumerate(runs):  # r0 holds; r1, r2 in the entry; r3... in segments
            entered = await slots.enter(one, run_id, f"2026-12-05T03:00:0{n}.000Z")
            assert (entered.held, entered.place) == (n == 0, n)
        written: list[int] = []
        for holder, following in itertools.pairwise(runs):
            before = await stored()
            assert await slots.release(one, holder) == [following]
            written.append(await stored() - before)
        # r1, r2 from the entry; r3 from a segment (r4, r5 move up: two keys); r4, r5 from
        # the entry; r6 from the last segment (r7 moves up); r7 from the entry.
        assert written == [1, 1, 2, 1, 1, 2, 1]
        assert await slots.release(one, runs[-1]) == []
        assert await slots.read(one.limit, one.key) is None
    finally:
        await nc.close()
