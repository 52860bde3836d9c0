"""A publisher's flood of fairness keys, as it would send it: its own credential (as
``interlock creds issue publisher`` makes it) and plain nats-py, events of a type it may
publish whose data names a new tenant each. The slots entry of a limit and key outlines
every fairness key's line; unbounded, some 3,000 keys of 256 characters made it larger
than the server takes (1,048,328 bytes against 1 MiB, measured), after which no change of
it could be written: not another tenant's run joining, not the holder's end freeing its
slot. Past :data:`slotlines.MAX_LINES` keys (4 here, 256 in use) the runs of new keys
wait in one shared line, each is found and removed there, and the tenant whose run
waited among them is admitted once the others are gone."""

from __future__ import annotations

import pytest

from interlock.core import events as ev
from interlock.runtime import slotlines
from interlock.runtime.concurrency import Slots
from support.auth import SUBJECTS, Secured, publish_event, publisher, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

SHARED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: shared}
spec:
  triggers:
    - event: acme.job
  concurrency:
    - {key: '"all"', limit: 1, fair: data.tenant}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: acme.go, goto: done}
    done: {type: terminal}
"""
FLOOD = 12


@pytest.fixture(autouse=True)
def few_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slotlines, "MAX_LINES", 4, raising=False)


async def waiting(slots: Slots) -> tuple[list[str], list[tuple[str, str]], int]:
    """The one entry's holders, its waiters (run id, fairness key) and its lines."""
    found = await slots.entries()
    if not found:
        return [], [], 0
    (entry,) = found
    lines = await slots.lines(entry.limit, entry.key)
    assert lines is not None
    out = []
    for line in lines.entry.lines:
        out += [(w.run_id, w.fair) for w in lines.inline(line)]
        for segment in line.segments:
            out += [(w.run_id, w.fair) for w in await lines.segment(line.fair, segment)]
    return [h.run_id for h in entry.holders], out, len(entry.lines)


async def test_a_flood_of_fairness_keys_leaves_the_limit_working(secured: Secured) -> None:
    applied = await secured.operator.apply([("shared.yaml", SHARED)])
    applied.compiled.raise_for_errors()
    nc, refusals = await publisher(secured, "acme.>", "flooding-publisher")
    slots = Slots(secured.operator.nc, SUBJECTS)

    async def job(n: int, tenant: str) -> None:
        await publish_event(nc, f"job-{n}", "acme.job", {"tenant": tenant})

    try:
        await job(0, "victim")

        async def held() -> list[str]:
            return (await waiting(slots))[0]

        (holder,) = await eventually(held, what="the victim's first run holding the slot")
        for n in range(1, FLOOD + 1):
            await job(n, f"tenant-{n:03d}-" + "x" * 240)
        await job(FLOOD + 1, "victim")

        async def all_in_line() -> bool:
            return len((await waiting(slots))[1]) == FLOOD + 1

        await eventually(all_in_line, what="every run of the flood in line")
    finally:
        await nc.close()
    assert not refusals.errors
    _, waiters, lines = await waiting(slots)
    assert lines <= 4 + 1  # the keys' own lines, and the others'
    (victim,) = [run for run, fair in waiters if fair == "victim"]
    # Each run of the flood is found where it waits and leaves when cancelled.
    for run_id, fair in waiters:
        if fair != "victim":
            assert await secured.operator.cancel(run_id)

    async def only_the_victim() -> bool:
        return [run for run, _ in (await waiting(slots))[1]] == [victim]

    await eventually(only_the_victim, what="the flood's runs out of line")
    assert await secured.operator.cancel(holder)

    async def admitted() -> bool:
        return any(isinstance(r, ev.RunAdmitted) for r in await secured.operator.read(victim))

    await eventually(admitted, what="the victim's second run admitted")
    assert await secured.operator.cancel(victim)
