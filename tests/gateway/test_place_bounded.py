"""A reader's description of a run deep in a line, over a real socket: the line's waiters
past its first few are kept in segments, and a run's place was looked for in every segment
before it, at every request, however long a publisher's flood made the line. The search
reads the first segments only (100 in use, 20,000 waiters; 1 of 2 waiters here): a run
found there has its place, one past them is said to wait, its place not said."""

from __future__ import annotations

import pytest

from interlock.client import queues
from interlock.runtime import slotlines
from interlock.transport.subjects import Subjects
from support.concurrency import ONE_SLOT
from support.gateway import gateway_stack, wait_status
from support.runtime import eventually

WAITERS = 6


@pytest.fixture(autouse=True)
def short_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slotlines, "HEAD", 1)
    monkeypatch.setattr(slotlines, "SEGMENT", 2)
    monkeypatch.setattr(queues, "PLACE_SEGMENTS", 1)


async def test_a_place_deep_in_a_line_is_not_searched_for(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        gateway_stack(nats_url, subjects, [ONE_SLOT]) as gs,
        gs.http() as http,
        gs.http("reader") as reader,
    ):
        r = await http.post("/runs", json={"workflow": "one", "run_id": "holder"})
        assert r.status_code == 201, r.text
        await wait_status(gs, "holder", "running", "wait")
        for n in range(1, WAITERS + 1):
            r = await http.post("/runs", json={"workflow": "one", "run_id": f"w{n}"})
            assert r.status_code == 201, r.text

        async def place(run_id: str) -> int | None:
            r = await reader.get(f"/runs/{run_id}")
            assert r.status_code == 200, r.text
            (slot,) = r.json()["slots"]
            assert not slot.get("holding"), slot
            return slot.get("place")

        async def all_in_line() -> list[list[str]]:
            groups = await slotlines_of(gs)
            found = sorted(run for group in groups for run in group)
            return groups if found == [f"w{n}" for n in range(1, WAITERS + 1)] else []

        # The head (kept in the entry), then the segments, as the line was cut.
        head, first, *rest = await eventually(all_in_line, what="every waiter in line")
        assert rest, (head, first)  # some waiters past the first segment
        for n, run_id in enumerate([*head, *first], start=1):
            assert await place(run_id) == n, run_id
        for run_id in [run for group in rest for run in group]:
            assert await place(run_id) is None, run_id


async def slotlines_of(gs: object) -> list[list[str]]:
    """The waiters of the one line as the slots bucket keeps them: those of the entry,
    then each segment's, in order."""
    from interlock.runtime.concurrency import Slots

    stack = gs.stack  # type: ignore[attr-defined]
    found = await Slots(stack.client.nc, stack.subjects).lines("default/one#1", "k")
    if found is None:
        return []
    out = [[w.run_id for w in found.entry.waiting]]
    for line in found.entry.lines:
        for segment in line.segments:
            out.append([w.run_id for w in await found.segment(line.fair, segment)])
    return out
