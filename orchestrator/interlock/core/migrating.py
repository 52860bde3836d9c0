"""A running run moved onto another version of its workflow, and the concurrency slots it
holds across the move. Pure.

``run.migrated`` names the slots the run held (or waited for) under the version it leaves
that the new version does not ask for (``freed``): the orchestrator gives them back when it
reads the record. When the new version asks for slots the run does not hold, a
``run.queued`` follows, naming every slot the run needs from then on. A run still queued
for its first state goes on waiting, now for those. A run already in a state stays there
(``holds``) and holds what reaches it (``event.held``, as a paused run does) until the
orchestrator admits it; ``run.admitted`` then decides the held events in the order they
came. So a run moved onto a limited version is at work under that limit only once it holds
its slot, and the logs never show more runs at work than the limit. A move never cancels a
run: the new slots are asked for with ``on_limit: queue``, whatever the limit says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.incoming import Incoming
from interlock.core.limits import claims
from interlock.core.pauses import is_pause
from interlock.core.vocabulary import RunStatus, TimerPurpose

if TYPE_CHECKING:
    from interlock.core.definition import Definition
    from interlock.core.state import RunState


def slots_after(definition: Definition, state: RunState) -> tuple[list[ev.SlotClaim], str | None]:
    """The slots the run needs once on ``definition``: a paused workflow's slot it waits
    for still, then the limits ``definition`` declares for its inputs and trigger (queued,
    never skipped or cancelling another); or why they cannot be computed."""
    kept = [c for c in state.slots or () if is_pause(c)]
    if not definition.concurrency:
        return kept, None
    trigger = None if state.trigger is None else Incoming.from_dict(state.trigger)
    wanted, problem = claims(definition, state.inputs, trigger)
    if problem is not None:
        return [], problem
    return kept + [replace(c, on_limit="queue") for c in wanted], None


def refusal(definition: Definition, state: RunState) -> str | None:
    """Why the run cannot move onto ``definition`` for its slots' sake (None: it can)."""
    if state.queued and any(t.purpose == TimerPurpose.RATE for t in state.timers.values()):
        return "the run waits for its trigger's rate; move it once that time has come"
    _, problem = slots_after(definition, state)
    return None if problem is None else f"on the new version, {problem}"


def migrate(
    definition: Definition,
    state: RunState,
    *,
    version: int,
    now: str,
    slots: list[ev.SlotClaim] | None = None,
) -> list[ev.AnyRecord]:
    """The records that move a running run onto another version of its workflow.
    ``slots``: those it needs from then on, as recorded (a re-drive); None: as
    ``definition`` says (nothing when they cannot be computed: see :func:`refusal`)."""
    from interlock.core.reactions import Reactions

    if state.status != RunStatus.RUNNING:
        return []
    if slots is None:
        if refusal(definition, state) is not None:
            return []
        slots, _ = slots_after(definition, state)
    wanted = {(c.limit, c.key) for c in slots}
    had = {(c.limit, c.key) for c in state.slots or ()}
    step = Reactions(definition, state, now)
    step.emit(
        ev.RunMigrated,
        ev.RunMigratedData(
            from_version=state.version,
            from_spec_hash=state.spec_hash,
            version=version,
            spec_hash=definition.spec_hash,
            checked_through=state.seq,
            freed=[c for c in state.slots or () if (c.limit, c.key) not in wanted],
        ),
    )
    if not wanted <= had or (state.queued and not slots):
        # Slots it does not hold; or, queued, none any more: the orchestrator admits it
        # on reading this.
        queued = ev.RunQueuedData(slots=slots, holds=bool(state.state), state=state.enters)
        step.emit(ev.RunQueued, queued)
    return step.out


def slots_moved(state: RunState, made: Sequence[ev.AnyRecord]) -> dict[str, Any]:
    """What a migration's records (``made``, on a run in ``state``) do to its concurrency
    slots, as ``interlock migrate`` reports it: those it gives back (``frees``, from
    ``run.migrated``) and those it asks for and waits for until it holds them (``asks``,
    from ``run.queued``, less those it holds already), each ``{"limit", "key"}``."""
    had = {(c.limit, c.key) for c in state.slots or ()}
    out: dict[str, Any] = {}
    for record in made:
        if isinstance(record, ev.RunMigrated) and record.data.freed:
            out["frees"] = [{"limit": c.limit, "key": c.key} for c in record.data.freed]
        elif isinstance(record, ev.RunQueued):
            asks = [c for c in record.data.slots if (c.limit, c.key) not in had]
            if asks:
                out["asks"] = [{"limit": c.limit, "key": c.key} for c in asks]
    return out
