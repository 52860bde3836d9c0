"""Concurrency limits with several orchestrators, and with one killed (SIGKILL) mid-run: the
limit is never exceeded at any instant (as the RUNS stream orders the records), no slot is
leaked, no run is lost or admitted twice, and runs of a key are admitted in order."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from interlock.runtime.concurrency import Slots
from interlock.runtime.service import Orchestrator
from interlock.transport.subjects import Subjects
from support.concurrency import KEYS, Timeline, limited, nap_agent, nap_worker, timeline
from support.runtime import client_for, connect, eventually, running_stack, serve, started

# Admission order is checked to a quarter of a second (RACE_S): another test process busy
# beside it on a 2-core machine can stretch one orchestrator's reads past that.
pytestmark = pytest.mark.serial

NAP_AGENT = nap_agent()
RACE_S = 0.25
"""How close two runs' run.queued may be for either to take a slot that frees first."""


def seconds(a: str, b: str) -> float:
    """``a`` - ``b``, RFC 3339 times, in seconds."""
    return (datetime.fromisoformat(a) - datetime.fromisoformat(b)).total_seconds()


def check(seen: Timeline, run_ids: list[str], limit: int) -> None:
    """Every run queued, admitted and completed once; never more than ``limit`` at work per
    key; each key's runs admitted in the order they were queued."""
    for run_id in run_ids:
        counts = seen.counts[run_id]
        assert counts.get("run.queued") == 1, (run_id, counts)
        assert counts.get("run.admitted") == 1, (run_id, counts)
        assert counts.get("run.completed") == 1, (run_id, counts)
    assert set(seen.most) == {("default/limited#1", k) for k in KEYS}
    assert max(seen.most.values()) == limit, seen.most
    for key in KEYS:
        mine = [r for r in seen.admitted if seen.slots[r][0].key == key]
        # A run admitted before one queued earlier: only when both were queued within the
        # same instant (a free slot goes to the first whose run.queued an orchestrator
        # reads; once runs wait, they are admitted in the order of their run.queued time).
        for i, early in enumerate(mine):
            for late in mine[i + 1 :]:
                ahead = seconds(seen.queued_at[late], seen.queued_at[early])
                assert ahead > -RACE_S, (key, early, late, ahead)


async def test_two_orchestrators_share_the_limits_exactly(
    nats_url: str, subjects: Subjects
) -> None:
    handled: list[int] = []
    async with (
        running_stack(nats_url, subjects, [NAP_AGENT, limited(capability="nap", limit=3)]) as s,
        nap_worker(nats_url, subjects, handled),
    ):
        second_nc = await connect(nats_url)
        second = Orchestrator(second_nc, subjects)
        await second.start()
        try:
            starts = [
                s.client.start("limited", {"customer": KEYS[n % 3], "n": n}) for n in range(60)
            ]
            run_ids = list(await asyncio.gather(*starts))
            outcomes = await asyncio.gather(*(s.wait(r, 60) for r in run_ids))
            assert {o.status for o in outcomes} == {"completed"}
            assert sorted(handled) == list(range(60))  # each action handed out once
            # Both replicas did part of the work.
            assert s.orchestrator.counters["actions_dispatched"] > 0
            assert second.counters["actions_dispatched"] > 0
            check(await timeline(s.client.nc, subjects), run_ids, 3)
            slots = s.orchestrator.flow.admission.slots

            async def freed() -> bool:  # (the last ends are relayed after they are read)
                return await slots.entries() == []

            await eventually(freed, what="every slot freed")
        finally:
            await second.stop()
            await second_nc.close()


async def test_an_orchestrator_killed_mid_run_leaks_no_slot(
    nats_url: str, subjects: Subjects
) -> None:
    handled: list[int] = []
    first = serve(nats_url, subjects.prefix)
    second: Any = None
    try:
        async with (
            client_for(nats_url, subjects) as client,
            nap_worker(nats_url, subjects, handled),
        ):
            applied = await client.apply(
                [("agent", NAP_AGENT), ("wf", limited(capability="nap", limit=2))]
            )
            assert applied.compiled.ok
            await started(first)
            second = serve(nats_url, subjects.prefix)
            await started(second)
            run_ids = [
                await client.start("limited", {"customer": KEYS[n % 3], "n": n}) for n in range(45)
            ]
            waits = [asyncio.create_task(client.wait(r, 60)) for r in run_ids]

            async def some_done() -> bool:
                return sum(t.done() for t in waits) >= 6

            await eventually(some_done, what="a few runs completed before the crash")
            first.kill()
            outcomes = await asyncio.gather(*waits)
            assert {o.status for o in outcomes} == {"completed"}
            assert sorted(set(handled)) == list(range(45))
            check(await timeline(client.nc, subjects), run_ids, 2)

            slots = Slots(client.nc, subjects)

            async def freed() -> bool:
                return await slots.entries() == []

            try:
                await eventually(freed, what="every slot freed")
            except AssertionError:
                left = await slots.entries()
                states = {
                    w.run_id: (await client.state(w.run_id)).status for e in left for w in e.holders
                }
                raise AssertionError(f"left: {left} {states}\n{second.output}") from None
            assert second.stop() == 0, second.output
    finally:
        first.kill()
        if second is not None:
            second.kill()
