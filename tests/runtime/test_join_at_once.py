"""A run an orchestrator starts while its limit is full joins its line in the step that
starts it, before the relay reads its ``run.queued`` (which then finds it there): a key's
runs started behind another key's flood do not wait for the relay to read the flood."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_atonce import ONE, Clock, crash_after_taking

from interlock.runtime.atonce import GRACE_S, AtOnce
from interlock.runtime.client import new_run_id
from interlock.runtime.concurrency import Slots
from interlock.runtime.slotlines import HEAD
from interlock.transport.subjects import Subjects
from support.concurrency import Gates, gated_stack, limited, timeline
from support.runtime import TIMEOUT, eventually, running_stack


async def test_runs_started_while_the_limit_is_full_are_in_line_before_the_relay_reads_them(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifest = limited(capability="gate", limit=1)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        flow = stack.orchestrator.flow
        relay_reads = asyncio.Event()
        queued = flow._queued

        async def held_up(record: Any) -> None:
            await relay_reads.wait()  # the relay's effect of each run.queued waits
            await queued(record)

        flow._queued = held_up  # type: ignore[method-assign]
        runs = stack.orchestrator.runs
        definition, version = await runs.registry.latest("limited")
        started = []
        for n in range(3):  # as a trigger starts them
            run_id = new_run_id()
            created, _ = await runs.start(definition, version, run_id, {"customer": "acme", "n": n})
            assert created
            started.append(run_id)

        async def first_at_work() -> bool:
            return gates.started == [0]

        await eventually(first_at_work, what="the first run at work (its slot was free)")
        lines = await flow.admission.slots.lines("default/limited#1", "acme")
        assert lines is not None
        assert [h.run_id for h in lines.entry.holders] == started[:1]
        assert [await lines.place(r, "") for r in started[1:]] == [1, 2]
        relay_reads.set()
        for n in range(3):
            gates.gate(n).set()
        for run_id in started:
            assert (await stack.wait(run_id)).status == "completed"
        assert gates.started == [0, 1, 2]
        seen = await timeline(stack.client.nc, subjects)
        assert seen.most[("default/limited#1", "acme")] == 1
        slots = flow.admission.slots

        async def emptied() -> bool:
            return await slots.entries() == []

        await eventually(emptied, what="nobody holding or waiting")


async def test_a_run_put_in_line_for_a_start_that_is_refused_leaves_it(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifest = limited(capability="gate", limit=1)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client = stack.client
        gates.gate(0).set()
        done = await client.start("limited", {"customer": "acme", "n": 0})
        assert (await stack.wait(done)).status == "completed"
        holding = await client.start("limited", {"customer": "acme", "n": 1})

        async def at_work() -> bool:
            return gates.started == [0, 1]

        await eventually(at_work, what="the second run holding the slot")
        # The first run started again (its trigger's event delivered twice, say): the
        # limit is full, so it is put in line, and its append is refused (it exists).
        runs = stack.orchestrator.runs
        definition, version = await runs.registry.latest("limited")
        created, _ = await runs.start(definition, version, done, {"customer": "acme", "n": 0})
        assert not created
        slots = stack.orchestrator.flow.admission.slots

        async def only_the_holder() -> bool:
            entries = await slots.entries()
            return [(e.queued, [h.run_id for h in e.holders]) for e in entries] == [(0, [holding])]

        await eventually(only_the_holder, what="the refused start out of the line")
        gates.gate(1).set()
        assert (await stack.wait(holding)).status == "completed"
        seen = await timeline(client.nc, subjects)
        assert seen.counts[done].get("run.admitted") == 1


async def test_a_run_put_in_line_by_a_process_killed_before_its_append_is_swept(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ONE]) as stack:
        holding = await stack.client.start("one", {"customer": "acme"})
        slots = stack.orchestrator.flow.admission.slots

        async def held() -> bool:
            found = await slots.entries()
            return [h.run_id for e in found for h in e.holders] == [holding]

        await eventually(held, what="a run holding the slot (its task held up)")
        doomed = crash_after_taking(nats_url, subjects, "rdoomed", "acme")
        assert doomed.wait_for(r"^TAKEN (.*)$").group(1) == holding
        assert doomed.proc.wait(TIMEOUT) == -9
        (entry,) = await slots.entries()
        assert [(w.run_id, w.early) for w in entry.waiting] == [("rdoomed", 1)]
        clock = Clock()
        flow = stack.orchestrator.flow
        sweeper = AtOnce(flow.admission, flow.capacity, stack.orchestrator.runs, clock).sweeper
        assert await sweeper.sweep() == 0  # too young: its append may be on its way
        clock.advance(GRACE_S + 1)
        assert await sweeper.sweep() == 1
        (entry,) = await slots.entries()
        assert (entry.queued, [h.run_id for h in entry.holders]) == (0, [holding])
        stack.recorder.release.set()
        assert (await stack.wait(holding, TIMEOUT)).status == "completed"

        async def emptied() -> bool:
            return await slots.entries() == []

        await eventually(emptied, what="nobody holding or waiting")


@pytest.mark.parametrize("again", ["orchestrator", "client"])
async def test_a_run_started_again_after_a_process_that_put_it_in_line_died_waits_once(
    nats_url: str, subjects: Subjects, again: str
) -> None:
    """A process puts a run in a long line (past the head kept in the entry) and is killed
    before its append; the run's start is tried again later under a later time (by an
    orchestrator, as its trigger's event delivered again; or by a client naming the run),
    so its order points past its earlier place: the start (or the relay reading its
    ``run.queued``) finds that place by the run's id and keeps it, and the run waits once
    and is admitted once."""
    async with running_stack(nats_url, subjects, [ONE]) as stack:
        client, slots = stack.client, stack.orchestrator.flow.admission.slots
        holding = await client.start("one", {"customer": "acme"})
        ahead = [await client.start("one", {"customer": "acme"}) for _ in range(HEAD)]

        async def head_full() -> bool:
            lines = await slots.lines("default/one#1", "acme")
            return lines is not None and lines.entry.queued == HEAD

        await eventually(head_full, what=f"{HEAD} runs in line, kept in the entry")
        doomed = crash_after_taking(nats_url, subjects, "rretried", "acme")
        assert doomed.wait_for(r"^TAKEN (.*)$").group(1) == holding
        assert doomed.proc.wait(TIMEOUT) == -9
        assert await in_line(slots, "rretried") == [(HEAD + 1, 1)]  # in a segment, early

        flow = stack.orchestrator.flow
        relayed, queued = asyncio.Event(), flow._queued

        async def noted(record: Any) -> None:
            await queued(record)
            if record.subject == "rretried":
                relayed.set()

        flow._queued = noted  # type: ignore[method-assign]
        if again == "orchestrator":
            runs = stack.orchestrator.runs
            definition, version = await runs.registry.latest("one")
            created, _ = await runs.start(definition, version, "rretried", {"customer": "acme"})
            assert created
        else:
            await client.start("one", {"customer": "acme"}, run_id="rretried")
        await asyncio.wait_for(relayed.wait(), TIMEOUT)  # the relay's look at its run.queued
        assert await in_line(slots, "rretried") == [(HEAD + 1, 1)]

        stack.recorder.release.set()
        for run_id in [holding, *ahead, "rretried"]:
            assert (await stack.wait(run_id, TIMEOUT)).status == "completed"
        seen = await timeline(client.nc, subjects)
        assert seen.counts["rretried"].get("run.queued") == 1
        assert seen.counts["rretried"].get("run.admitted") == 1
        assert seen.most[("default/one#1", "acme")] == 1

        async def emptied() -> bool:
            return await slots.entries() == []

        await eventually(emptied, what="nobody holding or waiting")


async def in_line(slots: Slots, run_id: str) -> list[tuple[int, int]]:
    """Each place of ``run_id`` in the line of ``one``'s limit for acme (head and
    segments, read whole), with its ``early`` mark."""
    lines = await slots.lines("default/one#1", "acme")
    assert lines is not None
    found = [w for line in lines.entry.lines for w in lines.inline(line)]
    for line in lines.entry.lines:
        for segment in line.segments:
            found += await lines.segment(line.fair, segment)
    return [(i + 1, w.early) for i, w in enumerate(found) if w.run_id == run_id]
