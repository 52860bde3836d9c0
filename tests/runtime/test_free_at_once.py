"""Slots freed at once on a real nats-server: the orchestrator that appends a run's end
frees its slots once the append is acknowledged, without waiting for its relay to read
the record back; the relay then frees nothing, and the limit is never exceeded."""

from __future__ import annotations

import asyncio
from typing import Any

from interlock.transport.subjects import Subjects
from support.concurrency import Gates, gated_stack, limited, timeline
from support.runtime import eventually


async def test_a_slot_is_handed_on_before_the_relay_reads_the_end_that_freed_it(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifest = limited(capability="gate", limit=1)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        flow = stack.orchestrator.flow
        relay_reads = asyncio.Event()
        finished = flow._finished

        async def after_the_test(handler: Any, record: Any) -> None:
            await relay_reads.wait()  # the relay's effects of a run's end wait
            await finished(handler, record)

        flow._finished = after_the_test  # type: ignore[method-assign]
        client = stack.client
        runs = [await client.start("limited", {"customer": "acme", "n": n}) for n in range(2)]

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(1), what="the first run at work")
        gates.gate(0).set()
        await eventually(lambda: started(2), what="the second run given the first one's slot")
        assert flow.freeing.settled(runs[0])
        entry = await flow.admission.slots.read("default/limited#1", "acme")
        assert entry is not None
        assert entry.admitted == 2  # the slot handed on here counts in its key's use
        relay_reads.set()
        gates.gate(1).set()
        for run_id in runs:
            assert (await stack.wait(run_id)).status == "completed"
        seen = await timeline(client.nc, subjects)
        assert seen.most[("default/limited#1", "acme")] == 1
        slots = flow.admission.slots

        async def emptied() -> bool:
            return await slots.entries() == []

        await eventually(emptied, what="nobody holding or waiting")
