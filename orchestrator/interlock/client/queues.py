"""Where a queued run stands: its place in each limit's line, read from the slots bucket."""

from __future__ import annotations

import msgspec

from interlock.core.state import RunState
from interlock.runtime.client import InterlockClient
from interlock.runtime.concurrency import Slots
from interlock.views.shapes import RunDescription, SlotView


async def with_places(
    ops: InterlockClient, described: RunDescription, state: RunState
) -> RunDescription:
    """``described`` with each slot of a queued run saying whether the run holds it, or
    its place in line, and how many runs hold one (as the orchestrator keeps them)."""
    if not state.queued or not described.slots:
        return described
    slots = Slots(ops.nc, ops.subjects)
    seen: list[SlotView] = []
    for view in described.slots:
        entry = await slots.read(view.limit, view.key)
        if entry is None:
            seen.append(msgspec.structs.replace(view, running=0))
            continue
        seen.append(
            msgspec.structs.replace(
                view,
                holding=any(h.run_id == state.run_id for h in entry.holders),
                place=entry.place(state.run_id),
                running=len(entry.holders),
            )
        )
    return msgspec.structs.replace(described, slots=seen)
