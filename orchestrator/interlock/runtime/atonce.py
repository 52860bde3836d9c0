"""Admission at once: free slots and tokens taken before the append that asks for them.

A run of a limited workflow asks for its slots in ``run.queued``, a request of a limited
capability in ``action.requested`` (``limits``), and the relay, reading the record, takes
them and appends the admission (:mod:`concurrency`, :mod:`capacity`): one more append,
one more relay read. When the orchestrator decides the start or the request itself and
finds every slot free with nobody in line (and every token there), it takes them first,
each a compare-and-set of its limit's entry, and appends the admission with the record
that asks: ``run.started``, ``run.queued``, ``run.admitted`` and the first state in one
append; ``action.requested`` then ``action.admitted`` (``at_once``) in one. The log says
what it says when the relay admits, in one message, and a limit that does not bind costs
its compare-and-sets and nothing else.

Such a slot is held before any log asks for it, so its holder is marked ``early`` in the
entry, named as every holder is (the run, or ``<run>/<action>#<attempt>``), with when it
was taken (``since``). If the append never happens (the process dies between the two, or
the append is refused), the slot is held for nothing: the sweep (:mod:`sweep`), run by
every orchestrator every :data:`SWEEP_EVERY_S` over the entries changed since its last,
frees an early holder older than :data:`GRACE_S` whose log does not ask for that slot (no
such run, the run or the request ended, another attempt) and clears the mark of one whose
log does; a refused append has its own holders checked at once. The admission goes in
the append only if the append is sent within :data:`APPEND_WITHIN_S` of the first take
(else the records go without it, and the relay admits as when it waits), so an append
cannot admit a run or a request whose slot a sweep freed: between them lie at least
``GRACE_S - APPEND_WITHIN_S`` (45 s), which a publish does not spend in flight. A token
taken for an append that never happens is lost: the rate is the stricter for it, never the
looser. A rate's tokens are taken in blocks while it is far from binding
(:mod:`rateblocks`): one compare-and-set for several requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from interlock.core import events as ev
from interlock.core.pauses import is_pause
from interlock.core.state import RunState, fold
from interlock.runtime.admitport import Decide
from interlock.runtime.capacity import Capacity, waiter_id
from interlock.runtime.concurrency import Admission, in_order
from interlock.runtime.rateblocks import RateBlocks
from interlock.runtime.runs import Decided
from interlock.runtime.slotlines import Lines, Waiter
from interlock.runtime.slotroom import free_now, wait_in_line
from interlock.runtime.slotturns import admit
from interlock.runtime.sweep import GRACE_S as GRACE_S
from interlock.runtime.sweep import SWEEP_EVERY_S as SWEEP_EVERY_S
from interlock.runtime.sweep import Sweep

if TYPE_CHECKING:
    from interlock.core.definition import Definition
    from interlock.runtime.payloads import Payloads
    from interlock.runtime.runs import Runs

log = logging.getLogger("interlock.atonce")

APPEND_WITHIN_S = 15.0
"""The admission goes with the append only if it is sent this soon after the first take."""


@dataclass(slots=True)
class Taken:
    """A decision's records with the admissions made at once added after them."""

    records: list[ev.AnyRecord]
    state: RunState
    asked: list[ev.AnyRecord]
    """The decision's records as it made them (without the admissions)."""
    held: list[tuple[ev.SlotClaim, str]]
    """The slots taken here, with their holders' names."""
    at: float
    """``time.monotonic()`` before the first take."""
    owner: AtOnce
    token_at: str | None = None
    """When the last rate token taken was (the request's admission then)."""
    admits: bool = False
    """Whether an admission was added to ``records``."""

    def in_time(self) -> bool:
        """Whether the admissions may still go with the append (:data:`APPEND_WITHIN_S`)."""
        return time.monotonic() - self.at <= APPEND_WITHIN_S

    def appending(self) -> tuple[list[ev.AnyRecord], RunState]:
        """What to append, and the run's state after it."""
        return self.records, self.state

    def refused(self) -> None:
        """The append was refused: the slots taken for it are checked against the logs."""
        self.owner.refused(self)


def wants(records: Sequence[ev.AnyRecord]) -> bool:
    """Whether a decision's records ask for slots or tokens (no I/O)."""
    for record in records:
        if type(record) is ev.RunQueued:
            return True
        if isinstance(record, ev.ActionRequested) and record.data.limits:
            return True
    return False


def admitted_later(records: Sequence[ev.AnyRecord]) -> bool:
    """Whether a run's records (read by the relay) admit it: its ``run.queued`` before
    then needs nothing done (its slots were taken before the append)."""
    return any(type(record) is ev.RunAdmitted for record in records)


def at_once(records: Sequence[ev.AnyRecord]) -> set[tuple[str, int]]:
    """The requests (action id, attempt) that ``records`` admit at once."""
    return {
        (r.data.action_id, r.data.attempt)
        for r in records
        if type(r) is ev.ActionAdmitted and r.data.at_once
    }


class AtOnce:
    """Slots and tokens taken before the append (see the module), and the sweep."""

    def __init__(
        self, admission: Admission, capacity: Capacity, runs: Runs, clock: Callable[[], str]
    ) -> None:
        self.slots, self.pauses = admission.slots, admission.pauses
        self._admission, self._capacity, self._runs, self._clock = admission, capacity, runs, clock
        self._later: set[asyncio.Task[None]] = set()
        self.sweeper = Sweep(admission, capacity, runs, clock)
        self.rates = RateBlocks(admission.slots, clock)
        admission.background.append(self.sweeper.sweeping)

    async def sweep(self, grace_s: float = GRACE_S) -> int:
        """One sweep now (:meth:`Sweep.sweep`): how many early holders were freed."""
        return await self.sweeper.sweep(grace_s)

    # -- before the append ----------------------------------------------------------------

    async def opening(
        self,
        run_id: str,
        definition: Definition,
        decided: tuple[list[ev.AnyRecord], RunState],
        payloads: Payloads | None,
        decide: Decide,
    ) -> Taken | None:
        """A run's first records (and its state after them) with its admission (and its
        requests') when its slots are free; None for a run whose values are kept by
        reference (the relay admits it)."""
        records, state = decided
        if not wants(records):
            return None
        if payloads is not None and await payloads.state(state) is not state:
            return None
        taken = await self._take(run_id, definition, records, state, decide)
        return taken if taken is not None and taken.in_time() else None

    async def take(
        self,
        run_id: str,
        definition: Definition,
        records: list[ev.AnyRecord],
        states: tuple[RunState, RunState | None],
        decide: Decide,
    ) -> Taken | None:
        """A decision's ``records`` on a run's state (``states``: before them, and after
        them when known) with the admissions of its requests whose slots and tokens are
        free, taken here; None: none is."""
        if not wants(records):
            return None
        before, after = states
        state = after if after is not None else fold(records, before)
        return await self._take(run_id, definition, records, state, decide)

    async def _take(
        self,
        run_id: str,
        definition: Definition,
        records: list[ev.AnyRecord],
        state: RunState,
        decide: Decide,
    ) -> Taken | None:
        began = time.monotonic()
        taken = Taken(list(records), state, records, [], began, self)
        queued = next((r for r in records if type(r) is ev.RunQueued), None)
        slots = state.slots
        if (
            isinstance(queued, ev.RunQueued)
            and queued.data.rate is None
            and state.queued
            and slots
            and not any(is_pause(c) for c in slots)
            and await self._take_all(in_order(slots), run_id, queued.time, taken, join=True)
        ):
            from interlock.core.limits import admitting  # the engine: not for readers

            now = self._clock()
            await self._extend(
                taken, decide, definition, lambda d, s: Decided(*admitting(d, s, now))
            )
        from interlock.core.capacity import admitted_at_once  # the engine: not for readers

        for index, record in enumerate(list(taken.records)):
            if type(record) is not ev.ActionRequested or not record.data.limits:
                continue
            d = record.data
            pending = taken.state.pending.get(d.action_id)
            if (
                d.workflow
                or pending is None
                or pending.attempt != d.attempt
                or not pending.held
                or self.pauses.holds_capability(d.capability)
            ):
                continue
            me = waiter_id(run_id, d.action_id, d.attempt)
            taken.token_at = None
            if not await self._take_all(d.limits, me, record.time, taken):
                continue
            now = taken.token_at or self._clock()
            went = admitted_at_once(definition, (taken.records, taken.state), now, index)
            if went is not None:
                self._capacity.note_at_once(run_id, d.action_id, d.attempt)
                taken.records, taken.state = went
                taken.admits = True
        return taken if taken.held or taken.admits else None

    async def _extend(
        self,
        taken: Taken,
        decide: Decide,
        definition: Definition,
        decision: Callable[[Definition, RunState], list[ev.AnyRecord] | Decided],
    ) -> None:
        out = await decide(decision, definition, taken.state)
        if isinstance(out, Decided):  # the state after it known: not folded again
            taken.records += out.records
            taken.state = out.state
            taken.admits = taken.admits or bool(out.records)
            return
        more = list(out)
        taken.records += more
        taken.state = fold(more, taken.state)
        taken.admits = taken.admits or bool(more)

    async def _take_all(
        self,
        claims: Sequence[ev.SlotClaim],
        name: str,
        since: str,
        taken: Taken,
        *,
        join: bool = False,
    ) -> bool:
        """Take a slot (or a token) of each claim, in the order given, while each is free;
        whether all were. The slots taken stay taken (the relay's admission finds them held).
        ``join`` (a run): a slot not free has the run put in its line (the relay, reading
        its ``run.queued``, finds it there) and the rest are left to the relay."""
        for claim in claims:
            if claim.per_s:
                at = await self.rates.take(claim)
                if at is None:
                    return False
                taken.token_at = at
                continue
            took = await self._slot(claim, name, since, join=join)
            if took is False:
                return False
            taken.held.append((claim, name))
            if took is None:
                return False
        return True

    async def _slot(
        self, claim: ev.SlotClaim, name: str, since: str, *, join: bool = False
    ) -> bool | None:
        """A free slot of ``claim`` for ``name``, if one is and nobody waits (True); else,
        with ``join`` and a limit that queues, ``name`` put in its line (None)."""
        holder = Waiter(name, since, claim.size, claim.priority, claim.fair, claim.weight, 1)

        async def change(lines: Lines) -> bool | None:
            entry = lines.entry
            if entry.per_s or entry.holds(name):
                return False
            if free_now(entry, holder):
                entry.size = claim.size
                admit(entry, holder, claim.fair)
                return True
            if not join or claim.on_limit != "queue":
                return False
            # Marked early: in no log until its append.
            return None if await wait_in_line(lines, holder, claim) is not None else False

        urgent = not join or self.slots.short(claim)
        took: bool | None = await self.slots.change(claim, change, urgent=urgent)
        return took

    # -- when the append is refused -------------------------------------------------------

    def refused(self, taken: Taken) -> None:
        """The append of ``taken`` was refused: each slot it took is given back unless a
        log asks for it (another append with the same holder's name went first), in the
        background (a run's lock may be held here; giving back moves others on)."""
        task = asyncio.create_task(self.sweeper.settle_all(taken.held))
        self._later.add(task)
        task.add_done_callback(self._later.discard)
