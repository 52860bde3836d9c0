"""Which waiter a free slot of a limit goes to, and which changes of an entry go first.

Fair share over recent use (:func:`pick`): within one limit and key, each fairness key has
a line; a free slot goes to the first waiter of the line whose key holds the fewest slots
plus used the fewest lately (:mod:`slotuse`), for its weight. Every slot taken is counted
(:func:`admit`): at once where free, from a line, or handed on as a run ends.

Changes first (:func:`urgent_first`): one process writes one entry at a time, the changes
asked meanwhile together in the next write (:class:`concurrency.Slots`). A change that
hands a slot on (a run's end) or takes a free one writes the entry alone, a plain
compare-and-set; a run entering a long line writes a segment too, an atomic batch, which
the server acknowledges 5 to 50 ms later. So when both wait, the first go in a write of
their own, and a flood of runs entering their line does not slow the handing on of the
slots beside it (the limit is kept either way: every write is a compare-and-set of the
entry as a whole; only which of two changes asked within a write's time goes first
differs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

from interlock.core import events as ev
from interlock.runtime.slotlines import STRIDE, Line, Lines, SlotEntry, Waiter
from interlock.runtime.slotroom import room
from interlock.runtime.slotuse import count, used, window

T = TypeVar("T")


async def grant(lines: Lines) -> list[str]:
    """Move waiters into the free slots; the runs moved. Each free slot goes to the first
    waiter of the line :func:`pick` picks."""
    entry = lines.entry
    moved: list[str] = []
    while entry.lines and not entry.per_s:  # a rate's lines go as tokens come
        line = pick(entry)
        first = await lines.head(line)
        if not room(entry, first):
            break
        line.passed += STRIDE // max(line.weight, 1)
        await lines.pop_head(line)
        admit(entry, first, line.fair)  # (the others' line counts as one key)
        moved.append(first.run_id)
    return moved


def admit(entry: SlotEntry, holder: Waiter, fair: str) -> None:
    """``holder`` into a slot of ``entry``: its key (``fair``) served last, and one more
    slot counted in its recent use."""
    entry.holders.append(holder)
    entry.turn = fair or entry.turn
    entry.admitted += 1
    entry.used = count(entry.used, entry.admitted, _window(entry), fair)


def let_go(entry: SlotEntry, run_id: str) -> bool:
    """Take the run out of the holders of ``entry``; whether it was there (one pass, in
    place: a check, then a filter into a new list, cost twice as much for 200 holders)."""
    holders, at = entry.holders, -1
    for i, holder in enumerate(holders):
        if holder.run_id == run_id:
            if at >= 0:  # (held twice, as only an entry written by hand may say)
                entry.holders = [h for h in holders if h.run_id != run_id]
                return True
            at = i
    if at < 0:
        return False
    del holders[at]
    return True


async def let_go_all(lines: Lines, items: Sequence[tuple[ev.SlotClaim, str]]) -> list[str]:
    """Each run of ``items`` (with its claim of this limit and key) taken out of the
    holders, in one pass over them, or out of its line; the runs given the slots that
    frees (:func:`grant`), or, when one was in neither (freed already: this is done
    again), every holder."""
    entry = lines.entry
    if len(items) == 1:  # (in place, in one pass that stops where it finds the run)
        claim, run_id = items[0]
        present = let_go(entry, run_id) or await lines.remove(run_id, claim.fair)
        granted = await grant(lines)
        return granted if present else [h.run_id for h in entry.holders]
    gone = {run_id for _, run_id in items}
    kept: list[Waiter] = []
    held: set[str] = set()
    for holder in entry.holders:
        if holder.run_id in gone:
            held.add(holder.run_id)
        else:
            kept.append(holder)
    entry.holders = kept
    absent = False
    for claim, run_id in items:
        if run_id not in held and not await lines.remove(run_id, claim.fair):
            absent = True
    granted = await grant(lines)
    return [h.run_id for h in entry.holders] if absent else granted


def recent(entry: SlotEntry) -> dict[str, float]:
    """Each fairness key's recent use of the entry's slots (:mod:`slotuse`; absent: 0)."""
    return used(entry.used, entry.admitted, _window(entry))


def _window(entry: SlotEntry) -> float:
    return window(entry.size, (line.weight for line in entry.lines))


def pick(entry: SlotEntry) -> Line:
    """The line served next: the fairness key whose slots held plus recent use
    (:mod:`slotuse`) are the fewest for its weight; among those, the one given the fewest
    slots for its weight while it waited (stride scheduling); among those, the next key
    after the one served last (round robin, in the order of the keys)."""
    load = recent(entry)
    for holder in entry.holders:
        load[holder.fair] = load.get(holder.fair, 0.0) + 1.0

    # Half the slot it is to be given counted: a key's count jumps by one at each of its
    # admissions, and ranking by the middle of that step keeps weighted shares within a
    # few percent of the weights (by the count before it, a heavier key got up to 15% less).
    def rank(line: Line) -> tuple[float, int]:
        return (load.get(line.fair, 0.0) + 0.5) / max(line.weight, 1), line.passed

    least = min(rank(line) for line in entry.lines)
    ties = [line for line in entry.lines if rank(line) == least]  # in the keys' order
    return next((line for line in ties if line.fair > entry.turn), ties[0])


MAX_DEFERRED = 4
"""Writes in a row that may leave the changes that are not urgent for the next one."""


def urgent_first(
    batch: list[tuple[T, asyncio.Future[Any]]], urgent: set[asyncio.Future[Any]], deferred: int
) -> tuple[list[tuple[T, asyncio.Future[Any]]], list[tuple[T, asyncio.Future[Any]]]]:
    """The changes of ``batch`` (in the order asked) to make in the next write, and those
    left for the write after: the ``urgent`` ones alone when others wait with them, unless
    those were left ``deferred`` writes in a row already (:data:`MAX_DEFERRED`)."""
    first = [b for b in batch if b[1] in urgent] if deferred < MAX_DEFERRED else []
    now, later = (first, [b for b in batch if b[1] not in urgent]) if first else (batch, [])
    if not later:
        now = batch
    urgent.difference_update(future for _, future in now)
    return now, later
