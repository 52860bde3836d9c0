"""Which waiter a free slot of a limit goes to, and which changes of an entry go first.

Fair share (:func:`pick`): within one limit and key, each fairness key has a line; a free
slot goes to the first waiter of the line whose key holds the fewest slots for its weight.

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
from fractions import Fraction
from typing import Any, TypeVar

from interlock.runtime.slotlines import STRIDE, Line, Lines, SlotEntry

T = TypeVar("T")


async def grant(lines: Lines) -> list[str]:
    """Move waiters into the free slots; the runs moved. Each free slot goes to the first
    waiter of the line :func:`pick` picks."""
    entry = lines.entry
    moved: list[str] = []
    while entry.lines and not entry.per_s:  # a rate's lines go as tokens come
        line = pick(entry)
        first = await lines.head(line)
        if len(entry.holders) >= first.size:
            break
        line.passed += STRIDE // max(line.weight, 1)
        await lines.pop_head(line)
        entry.holders.append(first)
        entry.turn = first.fair
        moved.append(first.run_id)
    return moved


def pick(entry: SlotEntry) -> Line:
    """The line served next: the fairness key holding the fewest slots for its weight;
    among those, the one given the fewest slots for its weight while it waited (stride
    scheduling: a key of weight 2 is given two for one of weight 1); among those, the
    next key after the one served last (round robin, in the order of the keys)."""
    held: dict[str, int] = {}
    for holder in entry.holders:
        held[holder.fair] = held.get(holder.fair, 0) + 1

    def rank(line: Line) -> tuple[Fraction, int]:
        return Fraction(held.get(line.fair, 0), max(line.weight, 1)), line.passed

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
