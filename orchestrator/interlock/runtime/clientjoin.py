"""A run a client starts (``interlock start``, :meth:`Client.start`) put in its line at once.

An orchestrator's own starts over a full limit join the limit's line before their append
(:mod:`atonce`). A client's start is appended by the client, and its ``run.queued`` is
read by an orchestrator's relay in the order the runs stream holds it: behind a flood's
records, the run joined its line only once the relay had read them, and every slot handed
on meanwhile went to those in line already. So the client, once its append is
acknowledged, puts the run in the line of its first limit itself, as the relay would on
reading it: the same waiter (its ``run.queued`` time and priority), its place found in
the same order, one compare-and-set of the limit's entry. The relay, reading the record
later, finds it there (and does the rest: a slot given, the next limits, the admission).

The client does only that. It takes no free slot and hands none on (its process may end
at once, and admitting runs is the orchestrators'), so it writes only when the run must
wait anyway: the first limit is full or has a line, the limit queues (``on_limit:
queue``), and its line is not at its bound. A run held by its workflow's pause, or by a
trigger's rate, is left to the relay; so is a run of several limits past its first (it
takes them in order, the next only once it holds the one before). Its log asks for the
slot before the write, so no sweep has anything to check, and a run found ended by the
time it is given the slot gives it back as any ended run does.

It needs a credential that may write the slots bucket (an operator's). The HTTP
gateway's may not (a compromised gateway could otherwise admit runs past any limit), so
runs started over HTTP join when the relay reads them: among the waiters then, in the
same order (priority, then the time of their ``run.queued``), but after the slots handed
on before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from interlock.core import events as ev
from interlock.core.pauses import is_pause
from interlock.transport.refusals import refusable
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.runtime.concurrency import Slots
    from interlock.runtime.slotlines import Lines

log = logging.getLogger("interlock.client")

JOIN_WITHIN_S = 5.0
"""How long the client tries (the relay does it anyway)."""


def first_wait(records: Sequence[ev.AnyRecord]) -> tuple[ev.SlotClaim, str] | None:
    """The limit a run's first records ask for first, with when it asked (its
    ``run.queued``), when the client may join its line; None otherwise."""
    queued = next((r for r in records if type(r) is ev.RunQueued), None)
    if not isinstance(queued, ev.RunQueued) or queued.data.rate is not None:
        return None
    if any(type(r) is ev.RunAdmitted for r in records):
        return None
    slots = queued.data.slots
    if not slots or any(is_pause(c) for c in slots):
        return None
    from interlock.runtime.concurrency import in_order  # (read only when it starts runs)

    return in_order(slots)[0], queued.time


async def join(slots: Slots, run_id: str, claim: ev.SlotClaim, since: str) -> int | None:
    """Put the run in the line of ``claim`` if it must wait for it (see the module); its
    place, or None when nothing was written (it was there, or need not or may not wait)."""
    from interlock.runtime.slotlines import Waiter
    from interlock.runtime.slotroom import free_now, wait_in_line

    waiter = Waiter(run_id, since, claim.size, claim.priority, claim.fair, claim.weight)

    async def change(lines: Lines) -> int | None:
        entry = lines.entry
        if entry.per_s or entry.holds(run_id) or free_now(entry, waiter):
            return None  # (a free slot: the relay takes it)
        return await wait_in_line(lines, waiter, claim)

    placed: int | None = await slots.change(claim, change)
    return placed


class LineJoiner:
    """What a client does after appending a run's first records: :func:`join` (when
    ``enabled``: the client's credential may write the slots bucket)."""

    def __init__(self, nc: Any, subjects: Subjects) -> None:
        self._nc, self._subjects = nc, subjects
        self._slots: Slots | None = None
        self.enabled = True

    async def join(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        """:func:`join` for a run whose first ``records`` were just appended, if they ask
        for a limit; a failure (a credential that may not write the slots bucket, a slow
        server) only leaves it to the relay."""
        found = first_wait(records) if self.enabled else None
        if found is None or found[0].on_limit != "queue":
            return
        if self._slots is None:
            from interlock.runtime.concurrency import Slots

            self._slots = Slots(self._nc, self._subjects)
        claim, since = found
        try:
            await asyncio.wait_for(
                refusable(self._nc, join(self._slots, run_id, claim, since)), JOIN_WITHIN_S
            )
        # The relay puts it in line when it reads its run.queued.
        except Exception as exc:  # noqa: BLE001
            log.debug("run %s left to join its line when read: %s", run_id, exc)
