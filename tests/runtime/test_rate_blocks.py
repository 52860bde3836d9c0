"""A capability rate's tokens taken in blocks (runtime/rateblocks.py) on a real
nats-server: one compare-and-set takes several tokens, later requests use them without a
write, a token whose slot has gone by is never used, fewer than a few tokens there are
taken one at a time; and two orchestrator processes sharing a rate never admit more than
it allows in any span of time (as their logs record the admissions)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time
from interlock.runtime.concurrency import Slots
from interlock.runtime.rateblocks import SPAN_S, RateBlocks
from interlock.runtime.slotlines import entry_key
from interlock.runtime.timers import ManualClock
from interlock.sdk import TaskContext, Worker
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.concurrency import requests
from support.runtime import client_for, connect, eventually, serve, serving, started, yaml

LIMIT, BURST = 100, 40
INTERVAL_S = 1 / LIMIT
CLAIM = ev.SlotClaim(limit="cap:tick:rate", key="", size=LIMIT, per_s=1.0, burst=BURST)

TICK_AGENT = yaml(
    f"""\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: tickagent
    spec:
      capabilities:
        - name: tick
          rate: {{limit: {LIMIT}, per: 1s, burst: {BURST}}}
    """
)

TICK = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: tick
    spec:
      inputs:
        n: {type: integer, required: true}
      triggers:
        - event: test.tick
      initial_state: work
      states:
        work:
          actions:
            - {capability: tick, input: {n: "{{ inputs.n }}"}}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


async def tat(slots: Slots) -> float:
    """The rate entry's theoretical arrival time (seconds since the epoch)."""
    token = entry_key(CLAIM.limit, CLAIM.key)
    found = [e for e in await slots.entries() if entry_key(e.limit, e.key) == token]
    return found[0].tat if found else 0.0


async def test_a_block_is_taken_in_one_write_and_its_past_slots_are_never_used(
    nats_url: str, subjects: Subjects
) -> None:
    clock = ManualClock("2026-01-01T00:00:00Z")
    start = parse_time(clock()).timestamp()
    nc = await connect(nats_url)
    try:
        async with client_for(nats_url, subjects):
            slots = Slots(nc, subjects)
            blocks = RateBlocks(slots, clock)
            assert await blocks.take(CLAIM) == clock()
            # A block of several tokens, their slots one interval apart from now.
            taken = round((await tat(slots) - start) / INTERVAL_S)
            assert 1 < taken <= SPAN_S / INTERVAL_S
            # The block's tokens are used with no write: the entry does not move.
            for _ in range(taken - 1):
                assert await blocks.take(CLAIM) == clock()
            assert round((await tat(slots) - start) / INTERVAL_S) == taken
            # The next take writes again, from where the block ended.
            assert await blocks.take(CLAIM) is not None
            end = await tat(slots)
            assert end > start + taken * INTERVAL_S
            # Time moves past the new block's slots but its first: those are dropped, and
            # the next take writes (the entry moves on from now), never a past slot used.
            clock.advance_to(parse_time("2026-01-01T00:00:01Z"))
            now = parse_time(clock()).timestamp()
            assert now > end
            assert await blocks.take(CLAIM) == clock()
            assert await tat(slots) > now
    finally:
        await nc.close()


async def test_requests_waiting_while_a_block_is_taken_are_served_by_the_next_one(
    nats_url: str, subjects: Subjects
) -> None:
    """A crowd of requests of one key arriving while its first block is being taken: the
    next block is sized for all of those still waiting, one write for them, not one
    block of the usual size after another."""
    clock = ManualClock("2026-01-01T00:00:00Z")
    wide = ev.SlotClaim(limit="cap:wide:rate", key="", size=100_000, per_s=1.0, burst=100_000)
    nc = await connect(nats_url)
    try:
        async with client_for(nats_url, subjects):
            blocks = RateBlocks(Slots(nc, subjects), clock)
            took = await asyncio.gather(*(blocks.take(wide) for _ in range(60)))
            assert took == [clock()] * 60
            info = await nc.jetstream().stream_info(f"KV_{subjects.slots_bucket}")
            # The first block (PER_BLOCK tokens, the key new here), then one for the rest.
            assert info.state.last_seq == 2
    finally:
        await nc.close()


async def test_close_to_the_limit_tokens_are_taken_one_at_a_time(
    nats_url: str, subjects: Subjects
) -> None:
    clock = ManualClock("2026-01-01T00:00:00Z")
    start = parse_time(clock()).timestamp()
    nc = await connect(nats_url)
    try:
        async with client_for(nats_url, subjects):
            slots = Slots(nc, subjects)
            blocks = RateBlocks(slots, clock)
            took = 0
            while await blocks.take(CLAIM) is not None:
                took += 1
                assert took <= BURST  # never more than the burst, the clock standing still
            assert took == BURST
            # The last few went one write each: the entry ends exactly at the burst.
            assert round((await tat(slots) - start) / INTERVAL_S) == BURST
    finally:
        await nc.close()


def admissions_fit(times: list[float], slack_s: float) -> bool:
    """Whether no span of time holds more admissions than the rate allows: between the
    i-th and the j-th, at most ``BURST + (t_j - t_i) / interval`` (``slack_s``: how late
    a record's time may be read after its token was taken)."""
    for i, j in itertools.combinations(range(len(times)), 2):
        if j - i + 1 > BURST + int((times[j] - times[i] + slack_s) / INTERVAL_S + 1e-9):
            return False
    return True


def tick(n: int) -> CloudEvent:
    return CloudEvent(id=f"tick-{n}", source="test://blocks", type="test.tick", data={"n": n})


async def test_two_orchestrators_sharing_a_rate_never_admit_more_than_it_allows(
    nats_url: str, subjects: Subjects
) -> None:
    first = serve(nats_url, subjects.prefix)
    second = serve(nats_url, subjects.prefix)
    try:
        async with client_for(nats_url, subjects) as client:
            assert (await client.apply([("agent", TICK_AGENT), ("wf", TICK)])).compiled.ok
            await started(first)
            await started(second)
            worker = Worker("tickagent", concurrency=64, grace_period=0.1)

            @worker.capability("tick")
            async def work(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
                return inp

            async def admitted() -> list[tuple[str, bool]]:
                """Each admission's time, and whether it was made at once."""
                asked = await requests(client.nc, subjects)
                return [(asked.admitted_at[r], r in asked.at_once) for r in asked.admitted]

            async with serving(nats_url, subjects, worker):
                # Under the burst: taken at once, in blocks, some tokens left over...
                await asyncio.gather(*(client.emit(tick(n)) for n in range(30)))
                await eventually(lambda: _at_least(admitted, 30), what="the first 30 admitted")
                await asyncio.sleep(1.0)  # ...their slots gone by, the burst back
                # Over the burst: the rate binds; tokens left over must not be used now.
                await asyncio.gather(*(client.emit(tick(n)) for n in range(30, 170)))
                await eventually(lambda: _at_least(admitted, 170), within=60, what="all in")
            records = await admitted()
        assert len(records) == 170
        assert sum(1 for _, at_once in records if at_once) >= 30
        times = sorted(parse_time(at).timestamp() for at, _ in records)
        # The relay's admissions record a time read a little after their token's take.
        assert admissions_fit(times, slack_s=0.005), times
        assert first.stop() == 0, first.output
        assert second.stop() == 0, second.output
    finally:
        first.kill()
        second.kill()


async def _at_least(admitted: Any, count: int) -> bool:
    return len(await admitted()) >= count
