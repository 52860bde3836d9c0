"""Capabilities' limits: requests held in line until they hold a slot and a token.

The run logs are the truth (:mod:`interlock.core.capacity`): a request of a limited
capability is ``action.requested`` with ``limits``; it is dispatched on ``action.admitted``
and leaves its lines on the record that ends it (``freed``). The slots bucket keeps, per
limit and key, who holds and who waits, in order (the same entries and compare-and-set
writes as runs' limits, :mod:`interlock.runtime.concurrency`), each request named
``<run>/<action>#<attempt>``:

- **concurrency**: a request holds a slot from before its ``action.admitted`` until after
  the record that ends it, so the requests the logs show admitted and not ended never
  outnumber the limit.
- **rate**: the entry keeps the limit's theoretical arrival time (GCRA): a token is there
  once the clock reaches ``tat - (burst - 1) * per / limit``, and taking one moves ``tat``
  on by ``per / limit``. A request given a token holds it from then until its
  ``action.admitted`` is read (so a crash between the two finds it there again, and never
  takes a second token for it). When requests wait, a durable timer (``Timers``: a
  JetStream scheduled message) wakes the line when the next token is due, whichever
  orchestrator reads it.
- **pause**: a request of a paused capability waits in the line ``cap:<name>@paused``
  (size 0) until the capability is resumed; resuming takes the line out in order.
- **stopping**: an attempt cancelled once dispatched keeps its concurrency slots while its
  worker stops (``stopping_until`` on the record that cancels it): until the worker's
  answer to it comes (its handler has ended: :meth:`Capacity.stopped`), or a durable
  timer at that instant fires, whichever is first.

Every change is the effect of a record the relay acknowledges only once it is done (or of
a fired timer, acknowledged the same way), and each repeats safely: a request holding or
waiting stays where it is, one admitted already records nothing, one that ended gives
back what it was given.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.pauses import capability_pause_claim, is_pause
from interlock.core.rfc3339 import format_time, parse_time
from interlock.runtime.concurrency import Slots
from interlock.runtime.errors import UnknownRun, UnknownWorkflow
from interlock.runtime.linefull import turn_away
from interlock.runtime.pausing import Pauses
from interlock.runtime.ratetokens import (
    EPSILON_S,
    interval,
    next_token_at,
    rate_route,
    rate_token,
    take_token,
)
from interlock.runtime.runs import Runs
from interlock.runtime.slotlines import Lines, Waiter, entry_key
from interlock.runtime.slotroom import crowded
from interlock.runtime.timers import Timers

log = logging.getLogger("interlock.capacity")

KEPT = 16_384
"""Requests held here remembered whole (one dispatched from another replica's hold, or
after a restart, is read back from its run's log)."""


def waiter_id(run_id: str, action_id: str, attempt: int) -> str:
    return f"{run_id}/{action_id}#{attempt}"


def parse_waiter(waiter: str) -> tuple[str, str, int] | None:
    """(run id, action id, attempt) of a request's name in a line (None: a run's)."""
    run_id, slash, rest = waiter.partition("/")
    action_id, hash_, attempt = rest.rpartition("#")
    if not slash or not hash_ or not attempt.isdigit():
        return None
    return run_id, action_id, int(attempt)


STOP = ":stop:"
"""What a stopping attempt's timer id holds between its run and its request
(``<run>:stop:<action>#<attempt>``; a run's own timers are ``<run>:<position>``)."""


def is_stop_timer(run_id: str, timer_id: str) -> bool:
    return timer_id.startswith(run_id + STOP)


@dataclass(frozen=True, slots=True)
class Took:
    """Where a request stands in one line: holding (``held``), waiting at ``place``, or
    turned away (``full``: ``place`` wait already); ``others``: requests moved into slots
    or given tokens meanwhile; ``wake_at``: when a rate's line should be woken."""

    held: bool
    place: int = 0
    others: tuple[str, ...] = ()
    wake_at: float | None = None
    full: bool = False


class Capacity:
    """Requests of limited or paused capabilities into their lines, and out."""

    def __init__(
        self,
        slots: Slots,
        pauses: Pauses,
        runs: Runs,
        timers: Timers,
        clock: Callable[[], str],
    ) -> None:
        self.slots, self.pauses, self._runs = slots, pauses, runs
        self._timers, self._clock = timers, clock
        self._requests: OrderedDict[tuple[str, str, int], ev.ActionRequested] = OrderedDict()
        """(run id, action id, attempt) -> the request, as read from its run's log."""
        self.at_once: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        """Requests admitted at once here (:mod:`atonce`): they hold no token in a line."""

    # -- what the relay asks ------------------------------------------------------------

    def holds(self, record: ev.ActionRequested) -> bool:
        """Whether the request waits here rather than going out now (no I/O): not one
        admitted at once (``admitted_at``)."""
        d = record.data
        if d.admitted_at is not None:
            return False
        return bool(d.limits) or self.pauses.holds_capability(d.capability)

    def remember(self, record: ev.ActionRequested) -> None:
        key = (record.subject, record.data.action_id, record.data.attempt)
        self._requests[key] = record
        self._requests.move_to_end(key)
        while len(self._requests) > KEPT:
            self._requests.popitem(last=False)

    def note_at_once(self, run_id: str, action_id: str, attempt: int) -> None:
        """A request is being admitted at once: its end leaves no rate's line."""
        self.at_once[run_id, action_id, attempt] = None
        while len(self.at_once) > KEPT:
            self.at_once.popitem(last=False)

    async def requested(self, record: ev.ActionRequested) -> None:
        """A request read from its run's log: into its lines (and admitted when it holds
        them all)."""
        self.remember(record)
        d = record.data
        await self._go_on(
            record.subject, d.action_id, d.attempt, d.limits, record.time, d.capability
        )

    def request_at_hand(self, admitted: ev.ActionAdmitted) -> ev.ActionRequested | None:
        """:meth:`request_of` when the request is remembered here (no I/O)."""
        d = admitted.data
        record = self._requests.get((admitted.subject, d.action_id, d.attempt))
        return None if record is None else _with_deadline(record, d.deadline)

    async def request_of(self, admitted: ev.ActionAdmitted) -> ev.ActionRequested | None:
        """The request an ``action.admitted`` lets go, its deadline the admission's."""
        d = admitted.data
        record = self._requests.get((admitted.subject, d.action_id, d.attempt))
        if record is None:
            records, _ = await self._runs.log.read(admitted.subject)
            for found in records:
                if (
                    isinstance(found, ev.ActionRequested)
                    and found.data.action_id == d.action_id
                    and found.data.attempt == d.attempt
                ):
                    record = found
            if record is None:
                return None
        return _with_deadline(record, d.deadline)

    async def admitted(self, record: ev.ActionAdmitted, request: ev.ActionRequested) -> None:
        """An admission read back (its request dispatched): the token it held leaves its
        rate's line."""
        d = record.data
        me = waiter_id(record.subject, d.action_id, d.attempt)
        for claim in request.data.limits:
            if claim.per_s and not d.at_once:  # (one admitted at once took its token only)
                await self._leave(claim, me)
        self._requests.pop((record.subject, d.action_id, d.attempt), None)

    def awaited(self, record: ev.AnyRecord, freed: Sequence[ev.FreedSlots]) -> bool:
        """Whether the record's effect here needs awaiting (the relay's awaited path): a
        request held, an admission, an end that gives something back (``freed``: what it
        names, no I/O). Not an end of requests admitted at once here holding rates' tokens
        only, which no line keeps, no retry-after holding their rates: :meth:`forget_ended`
        them, not :meth:`freed`."""
        if isinstance(record, ev.ActionRequested):
            return not record.data.workflow and self.holds(record)
        if not freed:
            return isinstance(record, ev.ActionAdmitted)
        run_id = record.subject
        return not all(
            (run_id, s.action_id, s.attempt) in self.at_once
            and s.rate_held_until is None
            and all(c.per_s for c in s.limits)
            for s in freed
        )

    def forget_ended(self, run_id: str, freed: Sequence[ev.FreedSlots]) -> None:
        """Requests ended that gave nothing back (:meth:`awaited`): not kept here."""
        for s in freed:
            self._requests.pop((run_id, s.action_id, s.attempt), None)
            self.at_once.pop((run_id, s.action_id, s.attempt), None)

    async def freed(self, run_id: str, freed: Sequence[ev.FreedSlots]) -> None:
        """Requests ended (the record names them): out of their lines, their slots to the
        next in line; a cancelled attempt's once its worker has stopped (or a timer)."""
        for slots in freed:
            me = waiter_id(run_id, slots.action_id, slots.attempt)
            self._requests.pop((run_id, slots.action_id, slots.attempt), None)
            at_once = (run_id, slots.action_id, slots.attempt) in self.at_once
            self.at_once.pop((run_id, slots.action_id, slots.attempt), None)
            held = slots.rate_held_until
            until = None if held is None else parse_time(held).timestamp()
            stopping = self._stopping(slots)
            for claim in slots.limits:
                if claim.per_s and at_once and until is None:
                    continue  # in no rate's line, ever
                if claim.per_s or is_pause(claim):
                    await self._leave(claim, me, until if claim.per_s else None)
                    continue
                if stopping:
                    continue  # held while its worker stops
                for other in await self.slots.release(claim, me):
                    if other != me:
                        await self.go_on_named(other)
            if stopping and slots.stopping_until is not None:
                timer = f"{run_id}{STOP}{slots.action_id}#{slots.attempt}"
                await self._timers.schedule(run_id, timer, slots.stopping_until)

    def _stopping(self, slots: ev.FreedSlots) -> bool:
        """Whether the slots ``slots`` names are held still while a worker stops."""
        until = slots.stopping_until
        return until is not None and parse_time(until) > parse_time(self._clock())

    async def stopped(self, run_id: str, slots: ev.FreedSlots) -> None:
        """A cancelled attempt's worker has stopped (it answered the attempt), or the
        latest it may take has passed: the slots it held go to the next in line."""
        from interlock.core.step import slot_of  # the engine: not for readers

        kept = [c for c in slots.limits if slot_of(c)]
        await self.freed(run_id, [replace(slots, limits=kept, stopping_until=None)])

    async def stop_due(self, run_id: str, timer_id: str) -> None:
        """A stopping attempt's timer: its slots go (read from its run's log)."""
        from interlock.core.capacity import stopping  # the engine: not for readers

        action_id, _, attempt = timer_id.removeprefix(run_id + STOP).rpartition("#")
        records, _ = await self._runs.log.read(run_id)
        slots = stopping(records, action_id, int(attempt)) if attempt.isdigit() else None
        if slots is not None:
            await self.stopped(run_id, slots)

    def _still_stopping(self, records: Sequence[ev.AnyRecord], me: str) -> bool:
        """Whether the attempt ``me`` names was cancelled and its worker may still be
        stopping, by its run's log (its slots are then kept; its timer frees them)."""
        from interlock.core.capacity import stopping  # the engine: not for readers

        parsed = parse_waiter(me)
        found = None if parsed is None else stopping(records, parsed[1], parsed[2])
        return found is not None and self._stopping(found)

    async def stopping_now(self, run_id: str, action_id: str, attempt: int) -> bool:
        """:meth:`_still_stopping`, the run's log read afresh."""
        records, _ = await self._runs.log.read(run_id, consistent=True)
        return self._still_stopping(records, waiter_id(run_id, action_id, attempt))

    async def resumed(self, capability: str) -> None:
        """A capability resumed: the requests that waited for it go on, first first."""
        for other in await self.slots.take_all(capability_pause_claim(capability)):
            await self.go_on_named(other)

    async def wake(self, route: str) -> None:
        """A rate line's timer: tokens to the first in line, as many as are there."""
        token = rate_token(route)
        now = parse_time(self._clock()).timestamp()

        async def change(lines: Lines) -> tuple[list[str], float | None]:
            entry = lines.entry
            if not entry.per_s:
                return [], None
            while entry.lines and take_token(entry, now):
                entry.holders.append(await lines.pop_head(entry.lines[0]))
            wake_at = next_token_at(entry) if entry.lines else None
            return [h.run_id for h in entry.holders], wake_at

        nobody = ev.SlotClaim(limit="", key="", size=0)
        holders, wake_at = await self.slots.change(nobody, change, token)
        if wake_at is not None:
            await self._wake_later(token, wake_at)
        for holder in holders:
            parsed = parse_waiter(holder)
            if parsed is None:
                continue
            record = self._requests.get(parsed)
            if record is not None and not self.pauses.holds_capability(record.data.capability):
                await self._admit(*parsed)  # a rate's line is a request's last
            else:  # read from its run: held for its paused capability, if it is
                await self.go_on_named(holder)

    # -- taking lines in turn -----------------------------------------------------------

    async def _go_on(
        self,
        run_id: str,
        action_id: str,
        attempt: int,
        lines: Sequence[ev.SlotClaim],
        since: str,
        capability: str,
    ) -> None:
        """Take the request's lines in order (pause, slot, token); admit it once it holds
        them all, else record what it waits for. The capability's pause is checked each
        time: a request moved into a slot while its capability is paused keeps the slot
        and waits for the resume in the pause's line."""
        me = waiter_id(run_id, action_id, attempt)
        lines = [c for c in lines if not is_pause(c)]
        if self.pauses.holds_capability(capability):
            lines.insert(0, capability_pause_claim(capability))
        for claim in lines:
            if is_pause(claim):
                if not self.pauses.holds_capability(claim.limit[4:].removesuffix("@paused")):
                    continue  # resumed since: on to the rest
                took = await self._enter(claim, me, since)
            elif claim.per_s:
                took = await self._enter_rate(claim, me, since)
            else:
                took = await self._enter(claim, me, since)
            for other in took.others:
                await self.go_on_named(other)
            if not took.held:
                await self._queued(run_id, action_id, attempt, claim, took)
                return
        await self._admit(run_id, action_id, attempt)

    async def go_on_named(self, waiter: str) -> None:
        """A request moved into a slot (or given a token): on to its next lines, read
        from its run; one that ended meanwhile gives back what it holds."""
        parsed = parse_waiter(waiter)
        if parsed is None:
            return
        run_id, action_id, attempt = parsed
        entry = await self._runs.load(run_id, fresh=True)
        pending = None if entry is None else entry.state.pending.get(action_id)
        if entry is None or entry.state.finished or pending is None or pending.attempt != attempt:
            await self._give_back(run_id, action_id, attempt)
            return
        if pending.held:
            await self._go_on(
                run_id, action_id, attempt, pending.limits, pending.requested_at, pending.capability
            )

    async def _give_back(self, run_id: str, action_id: str, attempt: int) -> None:
        """A request that ended, found holding or waiting (its end's effect came first,
        or it was put back in line by a repeat read after it): out of its lines, unless
        it was cancelled and its worker may still be stopping."""
        record = None
        records, _ = await self._runs.log.read(run_id)
        if self._still_stopping(records, waiter_id(run_id, action_id, attempt)):
            return
        for found in records:
            if (
                isinstance(found, ev.ActionRequested)
                and found.data.action_id == action_id
                and found.data.attempt == attempt
            ):
                record = found
        if record is None:
            return
        lines = [capability_pause_claim(record.data.capability), *record.data.limits]
        freed = ev.FreedSlots(action_id=action_id, attempt=attempt, limits=lines)
        await self.freed(run_id, [freed])

    async def _admit(self, run_id: str, action_id: str, attempt: int) -> None:
        """Record the admission (dispatched when the relay reads it); one that records
        nothing (admitted already, or ended) gives back what an ended request holds."""
        from interlock.core.capacity import admitted  # the engine: not for readers

        now = self._clock()
        async with self._runs.locked(run_id):
            try:
                records = await self._runs.apply(
                    run_id,
                    lambda d, s: admitted(d, s, now, action_id=action_id, attempt=attempt),
                )
            except (UnknownRun, UnknownWorkflow) as exc:
                log.warning("cannot admit %s of run %s: %s", action_id, run_id, exc)
                return
        if records:
            return
        entry = await self._runs.load(run_id, fresh=True)
        pending = None if entry is None else entry.state.pending.get(action_id)
        if pending is None or pending.attempt != attempt or entry is None or entry.state.finished:
            await self._give_back(run_id, action_id, attempt)

    async def _queued(
        self, run_id: str, action_id: str, attempt: int, claim: ev.SlotClaim, took: Took
    ) -> None:
        from interlock.core.capacity import queued  # the engine: not for readers

        if took.full:  # turned away: its attempt fails
            request = (run_id, action_id, attempt)
            await turn_away(self._runs, self._clock, request, claim, took.place)
            return
        now = self._clock()
        async with self._runs.locked(run_id):
            try:
                await self._runs.apply(
                    run_id,
                    lambda d, s: queued(
                        d,
                        s,
                        now,
                        action_id=action_id,
                        attempt=attempt,
                        limit=claim.limit,
                        key=claim.key,
                        place=took.place,
                    ),
                )
            except (UnknownRun, UnknownWorkflow) as exc:
                log.warning("cannot record the wait of %s of run %s: %s", action_id, run_id, exc)

    # -- one line -----------------------------------------------------------------------

    async def _enter(self, claim: ev.SlotClaim, me: str, since: str) -> Took:
        """A free slot if nobody waits first, else a place in line (a pause's always)."""
        entered = await self.slots.enter(claim, me, since)
        return Took(entered.held, entered.place, entered.others, full=entered.crowded)

    async def _enter_rate(self, claim: ev.SlotClaim, me: str, since: str) -> Took:
        """A token if one is there and nobody waits first, else a place in line (and the
        line's wake-up timer set for its next token)."""
        now = parse_time(self._clock()).timestamp()
        waiter = Waiter(me, since, claim.size, claim.priority)

        async def change(lines: Lines) -> Took:
            entry = lines.entry
            entry.size, entry.per_s, entry.burst = claim.size, claim.per_s, claim.burst
            if entry.holds(me):
                return Took(held=True)
            place = await lines.find(waiter)
            if place is None:
                if not entry.lines and take_token(entry, now):
                    entry.holders.append(waiter)
                    return Took(held=True)
                if crowded(entry, claim):
                    return Took(held=False, place=entry.queued, full=True)
                place = await lines.insert(waiter)
            return Took(held=False, place=place, wake_at=next_token_at(entry))

        took: Took = await self.slots.change(claim, change)
        if took.wake_at is not None:
            await self._wake_later(entry_key(claim.limit, claim.key), took.wake_at)
        return took

    async def _leave(self, claim: ev.SlotClaim, me: str, until: float | None = None) -> None:
        """Out of a line that frees no slot (a rate's, a pause's); with ``until``, the
        rate's next token not before then (an agent's retry-after: moving ``tat`` on is
        a maximum, so a repeat of the record changes nothing)."""
        now = parse_time(self._clock()).timestamp()

        async def change(lines: Lines) -> float | None:
            entry = lines.entry
            entry.holders = [h for h in entry.holders if h.run_id != me]
            await lines.remove(me, "")
            if until is not None and claim.per_s:
                # (an entry whose tokens were all back is gone: made again here)
                entry.size, entry.per_s, entry.burst = claim.size, claim.per_s, claim.burst
                held = until + (max(entry.burst, 1) - 1) * interval(entry)
                entry.tat = max(entry.tat, held)
            if not entry.holders and not entry.lines and entry.tat <= now:
                entry.tat = 0.0  # every token back: nothing worth keeping
            return next_token_at(entry) if until is not None and entry.lines else None

        wake_at: float | None = await self.slots.change(claim, change)
        if wake_at is not None:
            await self._wake_later(entry_key(claim.limit, claim.key), wake_at)

    async def _wake_later(self, token: str, at: float) -> None:
        """The rate line's wake-up, at ``at`` (the same one asked twice is one timer)."""
        route = rate_route(token)
        ms = math.ceil(at * 1000 - EPSILON_S)
        fire_at = format_time(datetime.fromtimestamp(ms / 1000, UTC))
        await self._timers.schedule(route, f"{route}:rate:{ms}", fire_at)


def _with_deadline(record: ev.ActionRequested, deadline: str | None) -> ev.ActionRequested:
    return replace(record, data=replace(record.data, deadline=deadline))
