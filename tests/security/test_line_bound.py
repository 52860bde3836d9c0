"""A publisher's flood into the line of one limit and key, as it would send it: its own
credential (as ``interlock creds issue publisher`` makes it) and plain nats-py. The
waiters are kept in segments, but the limit's entry outlines every segment, and nothing
bounded how many runs waited: past some 750,000 the outline alone outgrew the server's
payload limit and no change of the entry could be written. The lines of one limit and key
outline at most ``slotroom.MAX_SEGMENTS`` segments (2,500; 2 of 2 waiters here): a run
past them ends as ``on_limit: skip`` makes it, cancelled with the reason, and the line
goes on."""

from __future__ import annotations

import pytest

from interlock.core import events as ev
from interlock.runtime import slotlines, slotroom
from interlock.runtime.concurrency import Slots
from support.auth import SUBJECTS, Secured, publish_event, publisher, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

CROWD = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: crowd}
spec:
  triggers:
    - event: crowd.job
  concurrency:
    - {key: '"all"', limit: 1}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: crowd.go, goto: done}
    done: {type: terminal}
"""
RUNS = 10
REASON = "skipped: the line of default/crowd#1 is full for key 'all'"


@pytest.fixture(autouse=True)
def short_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slotlines, "HEAD", 1)
    monkeypatch.setattr(slotlines, "SEGMENT", 2)
    monkeypatch.setattr(slotroom, "MAX_SEGMENTS", 2)


async def test_a_line_past_its_bound_turns_runs_away_and_goes_on(secured: Secured) -> None:
    client = secured.operator
    applied = await client.apply([("crowd.yaml", CROWD)])
    applied.compiled.raise_for_errors()
    nc, refusals = await publisher(secured, "crowd.>", "crowding-publisher")
    slots = Slots(client.nc, SUBJECTS)
    try:
        for n in range(RUNS):
            await publish_event(nc, f"crowd-{n}", "crowd.job", {})
    finally:
        await nc.close()
    assert not refusals.errors

    async def outcomes() -> dict[str, str] | None:
        runs = await client.list_runs(workflow="crowd")
        if len(runs) != RUNS:
            return None
        found: dict[str, str] = {}
        for run in runs:
            records = await client.read(run["run_id"])
            last = records[-1]
            if isinstance(last, ev.RunCancelled):
                found[run["run_id"]] = last.data.reason or ""
            elif isinstance(last, ev.StateEntered):
                found[run["run_id"]] = "holds"
            elif isinstance(last, ev.RunQueued):
                found[run["run_id"]] = "waits"
            else:
                return None
        entry = await slots.read("default/crowd#1", "all")
        waiting = 0 if entry is None else entry.queued
        return found if waiting == list(found.values()).count("waits") else None

    found = await eventually(outcomes, within=30, what=f"the {RUNS} runs settled")
    assert set(found.values()) == {"holds", "waits", REASON}, found
    assert list(found.values()).count("holds") == 1
    entry = await slots.read("default/crowd#1", "all")
    assert entry is not None
    assert sum(len(line.segments) for line in entry.lines) <= 2
    # The line goes on: the holder's end admits the first in line.
    (holder,) = [run for run, what in found.items() if what == "holds"]
    assert await client.cancel(holder)

    async def next_holds() -> bool:
        now = await slots.read("default/crowd#1", "all")
        return now is not None and bool(now.holders) and now.holders[0].run_id != holder

    await eventually(next_holds, what="the first in line admitted")
