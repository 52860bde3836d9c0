"""A publisher's runs holding the slots of a large limit, each under a long fairness key
of its choosing, as it would send them: its own credential (as ``interlock creds issue
publisher`` makes it) and plain nats-py. Every holder is kept in the limit's entry, written
whole at every change in one message: a limit may declare up to 100,000 slots, and at
some 3,200 holders with fairness keys of 256 characters the entry outgrew what the server
takes (1 MiB), after which no change of it could be written, its holders' ends included.
Holders take at most ``slotroom.HOLDERS_BYTES`` of the entry (256 KiB; 4 KiB here): the
runs past it wait in line as at a full limit, and go on as holders leave."""

from __future__ import annotations

import pytest

from interlock.runtime import slotroom
from interlock.runtime.concurrency import Slots
from interlock.runtime.slotlines import encode
from support.auth import SUBJECTS, Secured, publish_event, publisher, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

LARGE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: large}
spec:
  triggers:
    - event: wide.job
  concurrency:
    - {key: '"all"', limit: 50, fair: data.tenant}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: wide.go, goto: done}
    done: {type: terminal}
"""
RUNS = 20
BOUND = 4096


@pytest.fixture(autouse=True)
def small_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slotroom, "HOLDERS_BYTES", BOUND)


async def test_holders_never_outgrow_their_room(secured: Secured) -> None:
    applied = await secured.operator.apply([("large.yaml", LARGE)])
    applied.compiled.raise_for_errors()
    nc, refusals = await publisher(secured, "wide.>", "wide-publisher")
    slots = Slots(secured.operator.nc, SUBJECTS)
    try:
        for n in range(RUNS):
            tenant = f"tenant-{n:03d}-" + "x" * 240
            await publish_event(nc, f"wide-{n}", "wide.job", {"tenant": tenant})
    finally:
        await nc.close()
    assert not refusals.errors

    async def settled() -> tuple[list[str], int] | None:
        found = await slots.lines("default/large#1", "all")
        if found is None or len(found.entry.holders) + found.entry.queued != RUNS:
            return None
        return [h.run_id for h in found.entry.holders], found.entry.queued

    holders, queued = await eventually(settled, what=f"the {RUNS} runs holding or in line")
    entry = await slots.read("default/large#1", "all")
    assert entry is not None
    assert len(encode(entry.holders)) <= BOUND
    assert 0 < len(holders) < RUNS, (len(holders), queued)
    # A holder's end gives its room to the next run in line.
    assert await secured.operator.cancel(holders[0])

    async def next_in() -> bool:
        found = await slots.read("default/large#1", "all")
        return found is not None and found.queued == queued - 1

    await eventually(next_in, what="a run in line admitted once a holder ended")
    entry = await slots.read("default/large#1", "all")
    assert entry is not None
    assert len(encode(entry.holders)) <= BOUND
    assert len(entry.holders) == len(holders)
