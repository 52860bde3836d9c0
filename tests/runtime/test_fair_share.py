"""Fair share on a real nats-server: weighted turns between fairness keys, a key that used
few slots lately served before one that used many, and each key's line kept in segments
of the slots bucket, exact with two orchestrators (the limit never
exceeded as the logs show it, every run admitted once, nothing left in the bucket)."""

from __future__ import annotations

import asyncio

import pytest
from test_concurrency_replicas import RACE_S, seconds

from interlock.runtime import slotlines
from interlock.runtime.client import new_run_id
from interlock.runtime.service import Orchestrator
from interlock.runtime.slotturns import recent
from interlock.transport.kvread import bucket_values
from interlock.transport.subjects import Subjects
from support.concurrency import (
    Gates,
    gated_stack,
    limited,
    nap_agent,
    nap_worker,
    timeline,
)
from support.runtime import connect, eventually, running_stack

FAIR = (
    "key: '\"all\"'\n      fair: inputs.customer\n"
    "      weight: 'inputs.customer == \"acme\" ? 2 : 1'"
)


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three waiters a segment and one at the head of a line kept in the entry: a few
    runs make a line of several segments."""
    monkeypatch.setattr(slotlines, "SEGMENT", 3)
    monkeypatch.setattr(slotlines, "HEAD", 1)


async def test_a_heavier_key_is_given_more_turns(nats_url: str, subjects: Subjects) -> None:
    """One slot; acme weighs 2, beta 1: acme is given two slots for each of beta's, and each
    key's runs go in their order across the segments of its line."""
    gates = Gates()
    manifest = limited(capability="gate", limit=1).replace("key: inputs.customer", FAIR)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client = stack.client
        first = await client.start("limited", {"customer": "zed", "n": 100})
        await eventually(lambda: _started(gates, 1), what="the first run at work")
        runs = [await client.start("limited", {"customer": "acme", "n": n}) for n in range(1, 7)]
        runs += [await client.start("limited", {"customer": "beta", "n": n}) for n in (11, 12, 13)]
        slots = stack.orchestrator.flow.admission.slots

        async def all_in_line() -> bool:
            found = await slots.entries()
            return bool(found) and found[0].queued == len(runs)

        await eventually(all_in_line, what="every run in line")
        (entry,) = await slots.entries()
        assert [(line.fair, line.weight, len(line.segments)) for line in entry.lines] == [
            ("acme", 2, 2),
            ("beta", 1, 1),
        ]
        for n in [100, 1, 2, 3, 4, 5, 6, 11, 12, 13]:
            gates.gate(n).set()
        for run_id in [first, *runs]:
            assert (await stack.wait(run_id)).status == "completed"
        # By recent use for its weight: acme (used nothing, zed's turn last) first, then
        # beta (used nothing), then two of acme's for each of beta's, acme's last at the end.
        assert gates.started == [100, 1, 11, 2, 3, 12, 4, 5, 13, 6]
        kv = await client.js.key_value(subjects.slots_bucket)
        assert await bucket_values(kv) == {}  # every segment deleted with its last waiter


async def test_a_run_given_a_free_slot_counts_as_its_keys_turn(
    nats_url: str, subjects: Subjects
) -> None:
    """acme's first run takes the free slot at once; then acme and beta each queue one:
    the slot it frees goes to beta, the key after the one served last, not to acme again."""
    gates = Gates()
    fair = "key: '\"all\"'\n      fair: inputs.customer"
    manifest = limited(capability="gate", limit=1).replace("key: inputs.customer", fair)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client = stack.client
        first = await client.start("limited", {"customer": "acme", "n": 100})
        await eventually(lambda: _started(gates, 1), what="the first run at work")
        runs = [
            await client.start("limited", {"customer": c, "n": n})
            for c, n in (("acme", 1), ("beta", 11))
        ]
        slots = stack.orchestrator.flow.admission.slots

        async def both_in_line() -> bool:
            found = await slots.entries()
            return bool(found) and found[0].queued == 2

        await eventually(both_in_line, what="both runs in line")
        for n in (100, 1, 11):
            gates.gate(n).set()
        for run_id in [first, *runs]:
            assert (await stack.wait(run_id)).status == "completed"
        assert gates.started == [100, 11, 1]


async def test_two_orchestrators_keep_the_lines_exact(nats_url: str, subjects: Subjects) -> None:
    handled: list[int] = []
    customers = ("acme", "beta", "gamma")
    manifest = limited(capability="nap", limit=2).replace("key: inputs.customer", FAIR)
    async with (
        running_stack(nats_url, subjects, [nap_agent(), manifest]) as s,
        nap_worker(nats_url, subjects, handled),
    ):
        second_nc = await connect(nats_url)
        second = Orchestrator(second_nc, subjects)
        await second.start()
        try:
            starts = [
                s.client.start("limited", {"customer": customers[n % 3], "n": n}) for n in range(36)
            ]
            run_ids = list(await asyncio.gather(*starts))
            outcomes = await asyncio.gather(*(s.wait(r, 60) for r in run_ids))
            assert {o.status for o in outcomes} == {"completed"}
            assert sorted(handled) == list(range(36))
            seen = await timeline(s.client.nc, subjects)
            for run_id in run_ids:
                counts = seen.counts[run_id]
                assert counts["run.queued"] == counts["run.admitted"] == 1, counts
            assert seen.most == {("default/limited#1", "all"): 2}
            for customer in customers:
                mine = [r for r in seen.admitted if seen.slots[r][0].fair == customer]
                for i, early in enumerate(mine):
                    for late in mine[i + 1 :]:
                        ahead = seconds(seen.queued_at[late], seen.queued_at[early])
                        assert ahead > -RACE_S, (customer, early, late, ahead)
            kv = await s.client.js.key_value(subjects.slots_bucket)

            async def emptied() -> bool:
                return await bucket_values(kv) == {}

            await eventually(emptied, what="the entry and every segment deleted")
        finally:
            await second.stop()
            await second_nc.close()


async def _started(gates: Gates, count: int) -> bool:
    return len(gates.started) >= count


async def test_a_key_whose_admission_is_held_up_does_not_hold_up_another_keys_runs(
    nats_url: str, subjects: Subjects
) -> None:
    """acme's run is given a slot but its admission cannot be recorded yet (its run is
    busy, as a slow decision of it keeps it): beta's run, read after it, is admitted and
    ends meanwhile; acme's goes on once its run is free."""
    gates = Gates()
    manifest = limited(capability="gate", limit=2).replace(
        "key: inputs.customer", "key: '\"all\"'\n      fair: inputs.customer"
    )
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client, slots = stack.client, stack.orchestrator.flow.admission.slots
        gates.gate(1).set()
        gates.gate(2).set()
        acme = new_run_id()
        async with stack.orchestrator.runs.locked(acme):
            await client.start("limited", {"customer": "acme", "n": 1}, run_id=acme)

            async def acme_holds() -> bool:
                return any(e.holds(acme) for e in await slots.entries())

            await eventually(acme_holds, what="acme's run given its slot")
            beta = await client.start("limited", {"customer": "beta", "n": 2})
            assert (await stack.wait(beta, 10)).status == "completed"
            assert (await client.state(acme)).queued  # its admission not recorded yet
        assert (await stack.wait(acme)).status == "completed"
        assert gates.started == [2, 1]


async def test_a_key_joining_beside_a_backlog_is_given_the_slots_that_free_first(
    nats_url: str, subjects: Subjects
) -> None:
    """Two slots. acme ran six runs (four done, two at work) and keeps four more in line;
    beta's two runs join after them. Each slot that frees goes to beta until beta's slots
    and recent use reach acme's: both of beta's runs start before acme's next (with equal
    shares of the slots held, acme's 7 went second, beta holding one and acme none)."""
    gates = Gates()
    fair = "key: '\"all\"'\n      fair: inputs.customer"
    manifest = limited(capability="gate", limit=2).replace("key: inputs.customer", fair)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client, slots = stack.client, stack.orchestrator.flow.admission.slots
        runs = [await client.start("limited", {"customer": "acme", "n": n}) for n in range(1, 7)]
        # The first four let go once all six are in: two slots held throughout (an entry
        # that empties is deleted, and its count of slots taken with it).
        await eventually(lambda: _started(gates, 2), what="acme's first two runs at work")
        for n in range(1, 5):
            gates.gate(n).set()
        await eventually(lambda: _started(gates, 6), what="acme's first six runs at work")
        runs += [await client.start("limited", {"customer": "acme", "n": n}) for n in range(7, 11)]
        runs += [await client.start("limited", {"customer": "beta", "n": n}) for n in (11, 12)]

        async def all_in_line() -> bool:
            found = await slots.entries()
            return bool(found) and found[0].queued == 6

        await eventually(all_in_line, what="acme's four and beta's two in line")
        (entry,) = await slots.entries()
        assert entry.admitted == 6  # each slot taken counted: free ones and handed on
        assert set(recent(entry)) == {"acme"}
        gates.gate(5).set()
        await eventually(lambda: _started(gates, 7), what="a run given acme 5's slot")
        gates.gate(6).set()
        await eventually(lambda: _started(gates, 8), what="a run given acme 6's slot")
        assert sorted(gates.started[:6]) == [1, 2, 3, 4, 5, 6]
        assert gates.started[6:] == [11, 12]
        (entry,) = await slots.entries()
        assert entry.admitted == 8
        assert {h.fair for h in entry.holders} == {"beta"}
        for n in range(7, 13):
            gates.gate(n).set()
        for run_id in runs:
            assert (await stack.wait(run_id)).status == "completed"
        assert sorted(gates.started[8:]) == [7, 8, 9, 10]  # two slots: two at a time
