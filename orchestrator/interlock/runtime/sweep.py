"""The sweep of slots taken at once: early holders no log asks for, and spent rate entries.

A slot taken before the append that asks for it (:mod:`atonce`) is held by an *early*
holder; if the append never happens, nothing else would free it. Every orchestrator
sweeps every :data:`SWEEP_EVERY_S`: an early holder older than :data:`GRACE_S` whose log,
read afresh, does not ask for its slot is given back (the slot going to the first in
line), one whose log asks loses its mark; so is a run put in line before its append
(:mod:`atonce`), once it is at the head of its line, kept in the entry (given its slot,
it is an early holder); a rate entry whose every token is back is deleted.

What a sweep reads is what can need it, not the whole bucket: an early holder is written
into its entry by the take, so its entry is among the entries written since the previous
sweep. Each sweep reads the bucket's records after the revision the last one read through
(the slots bucket keeps one record per key, so that is one per entry changed, whatever
the number of changes), and keeps in memory the entries that may need a later look: those
with an early holder still too young, and rates whose tokens are not all back yet. An
entry that changes again is read again; one that does not is as kept. The first sweep of
a process reads every entry (what a process that died left behind included). So a sweep
costs the entries changed in the last minute, and an installation whose limits hold long
runs or many idle keys pays nothing for them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time
from interlock.runtime.capacity import Capacity, parse_waiter
from interlock.runtime.concurrency import Admission
from interlock.runtime.slotlines import Lines, SlotEntry, entry_key

if TYPE_CHECKING:
    from interlock.runtime.runs import Runs

log = logging.getLogger("interlock.atonce")

GRACE_S = 60.0
"""How old an early holder is before a sweep may free it for want of a log asking."""
SWEEP_EVERY_S = 60.0
"""How often each orchestrator sweeps the slots bucket (give or take a tenth)."""


def _may_need(entry: SlotEntry) -> bool:
    """Whether a sweep has anything to look at in ``entry``: an early holder (or waiter),
    or a rate's tokens out (the others are not kept: an entry outlines up to 256 lines)."""
    if entry.per_s:
        return bool(entry.tat) and not entry.holders and not entry.lines
    return any(h.early for h in (*entry.holders, *entry.waiting))


class Sweep:
    """The early holders of one process's view of the slots bucket, checked against the
    logs; what it freed and what it read, counted for the metrics."""

    def __init__(
        self, admission: Admission, capacity: Capacity, runs: Runs, clock: Callable[[], str]
    ) -> None:
        self.slots = admission.slots
        self._admission, self._capacity, self._runs, self._clock = admission, capacity, runs, clock
        self._through = 0
        """The bucket's revision the sweeps have read through (0: none yet: all of it)."""
        self._watch: dict[str, SlotEntry] = {}
        """Entries a later sweep must look at again, as last read."""
        self.freed: Counter[str] = Counter()
        """Early holders given back, by kind: ``run`` or ``request``."""
        self.read = 0
        """Entries the sweeps read from the bucket."""

    async def sweeping(self) -> None:
        """Sweep every :data:`SWEEP_EVERY_S`, give or take a tenth, until cancelled."""
        while True:
            await asyncio.sleep(SWEEP_EVERY_S * random.uniform(0.9, 1.1))
            try:
                await self.sweep()
            # Done again at the next round.
            except Exception as exc:  # noqa: BLE001
                log.warning("could not sweep the slots taken at once: %s", exc)

    async def sweep(self, grace_s: float = GRACE_S) -> int:
        """Every early holder older than ``grace_s`` among the entries changed since the
        last sweep (or kept from it): freed when no log asks for its slot, else its mark
        cleared; and rates whose every token is back, deleted. How many holders were
        freed."""
        now = parse_time(self._clock()).timestamp()
        changed, self._through = await self.slots.written_after(self._through, _may_need)
        self.read += len(changed)
        for token, entry in changed.items():
            if entry is None:
                self._watch.pop(token, None)
            else:
                self._watch[token] = entry
        freed = 0
        for token, entry in list(self._watch.items()):
            again = False
            if entry.per_s:
                if not entry.holders and not entry.lines and entry.tat:
                    if entry.tat <= now:
                        await self._forget_rate(entry, now)
                    else:
                        again = True  # its tokens come back later
            else:
                # (and the waiters put in line so, at the head of their lines)
                for holder in [*entry.holders, *entry.waiting]:
                    if not holder.early:
                        continue
                    if now - parse_time(holder.since).timestamp() < grace_s:
                        again = True  # its append may be on its way
                        continue
                    claim = ev.SlotClaim(
                        limit=entry.limit, key=entry.key, size=holder.size, fair=holder.fair
                    )
                    asked = await self.asked(claim, holder.run_id)
                    freed += await self.settle(claim, holder.run_id, asked)
            if not again:
                self._watch.pop(token, None)
        return freed

    async def settle_all(self, held: Sequence[tuple[ev.SlotClaim, str]]) -> None:
        """The slots taken for an append that was refused, each checked against its log."""
        try:
            for claim, name in held:
                await self.settle(claim, name, await self.asked(claim, name))
        # The sweep frees what is left.
        except Exception as exc:  # noqa: BLE001
            log.warning("could not give back slots taken for a refused append: %s", exc)

    async def asked(self, claim: ev.SlotClaim, name: str) -> bool:
        """Whether the log of ``name`` (a run, or a run's request) asks for the slot and
        has not ended, or (a request) was cancelled and its worker may still be stopping."""
        parsed = parse_waiter(name)
        run_id = name if parsed is None else parsed[0]
        entry = await self._runs.load(run_id, fresh=True)
        pending = None
        if parsed is not None and entry is not None and not entry.state.finished:
            pending = entry.state.pending.get(parsed[1])
        if parsed is not None and (pending is None or pending.attempt != parsed[2]):
            # A cancelled attempt whose worker may still be stopping keeps its slot.
            return entry is not None and await self._capacity.stopping_now(*parsed)
        if entry is None or entry.state.finished:
            return False
        wanted = (claim.limit, claim.key)
        if pending is None:
            return any((c.limit, c.key) == wanted for c in entry.state.slots or [])
        return any((c.limit, c.key) == wanted for c in pending.limits)

    async def settle(self, claim: ev.SlotClaim, name: str, asked: bool) -> int:
        """An early holder checked against its log: kept, its mark cleared (``asked``),
        or given back, the slot going to the next in line (1)."""
        if not asked:
            parsed = parse_waiter(name)
            if parsed is None:
                await self._admission.ended(name, [claim])
            else:
                run_id, action_id, attempt = parsed
                gone = ev.FreedSlots(action_id=action_id, attempt=attempt, limits=[claim])
                await self._capacity.freed(run_id, [gone])
            self.freed["run" if parsed is None else "request"] += 1
            log.warning(
                "freed a slot of %s (%r) taken for %s, which no log asks for",
                claim.limit,
                claim.key,
                name,
            )
            return 1

        async def change(lines: Lines) -> None:
            entry = lines.entry
            entry.holders = [
                replace(h, early=0) if h.run_id == name and h.early else h for h in entry.holders
            ]
            entry.waiting = [
                replace(w, early=0) if w.run_id == name and w.early else w for w in entry.waiting
            ]

        await self.slots.change(claim, change)
        return 0

    async def _forget_rate(self, entry: SlotEntry, now: float) -> None:
        """A rate whose every token is back: its entry deleted (a full burst is there)."""

        async def change(lines: Lines) -> None:
            found = lines.entry
            if not found.holders and not found.lines and found.tat <= now:
                found.tat = 0.0

        claim = ev.SlotClaim(limit=entry.limit, key=entry.key, size=entry.size)
        await self.slots.change(claim, change, entry_key(entry.limit, entry.key))
