"""Tokens of a capability's rate taken in blocks: one compare-and-set of the rate's entry
takes several, and this process hands them to its requests admitted at once, each without
a write.

A rate entry keeps its theoretical arrival time (``tat``, GCRA, :mod:`capacity`): taking
a token at ``now`` gives it the slot ``s = max(tat, now)`` and moves ``tat`` on by
``per / limit``; the token is there if ``s - (burst - 1) · per / limit <= now``. A block
is ``k`` such tokens taken in one change, their slots ``s, s + i, … s + (k-1)·i`` (``i`` =
``per / limit``), each there at the take. Each is used here at most once, and no later
than its slot: the first by the request that asked for the block, the others by later
requests, the earliest slot not yet past first; one whose slot is past is dropped, never
used (the rate is the stricter for it, never the looser). So every token, taken alone or
in a block, by whichever process, is used between ``s - (burst - 1)·i`` and ``s``, at a
slot of its own: a span of ``d`` seconds holds at most ``burst + d / i`` of them, what one
token at a time allows. A process that dies holding a block loses its tokens (their slots
go by); nothing is given back, nothing needs to be.

The size of a block follows the demand: sized to serve :data:`PER_BLOCK` requests at the
pace the last block was used, its slots spanning at most :data:`SPAN_S`, and at most a
quarter of the tokens there (so other replicas, which take theirs the same way, find
most of the burst), or more when more requests wait for it as it is taken. Under
:data:`MIN_THERE` tokens there (the limit binds, or is close),
a block is one token: the exact path, as when no block is taken. A token is taken (one or
a block) only when nobody waits in the rate's line; finding someone waiting, the request
waits in line behind them. A block taken before a line formed is still used until its
last slot (at most :data:`SPAN_S` on), the one way a request of this process may be
admitted while an earlier one waits: its token was taken before that one asked.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time
from interlock.runtime.concurrency import Slots
from interlock.runtime.ratetokens import EPSILON_S
from interlock.runtime.slotlines import Lines, SlotEntry, entry_key

PER_BLOCK = 16
"""A block is sized to serve this many requests at the pace its key's last one was used."""
SPAN_S = 0.05
"""A block's slots span at most this long (how long it may be used)."""
MIN_THERE = 8
"""Fewer tokens there than this: one at a time (the exact path)."""
MAX_KEYS = 4096
"""Blocks kept (keys of rates used lately): beyond, the oldest are dropped (lost)."""


def take_tokens(entry: SlotEntry, now: float, want: int) -> tuple[float, float, int]:
    """Up to ``want`` of the rate's tokens there by ``now`` (at least one if any is, one
    only when fewer than :data:`MIN_THERE` are), ``tat`` moved on past them: their slots,
    as the first, the interval between two and how many (none: 0)."""
    interval = entry.per_s / max(entry.size, 1)
    tolerance = (max(entry.burst, 1) - 1) * interval
    start = max(entry.tat, now)
    if now + EPSILON_S < start - tolerance:
        return start, interval, 0
    there = int((now + EPSILON_S + tolerance - start) / interval) + 1
    k = 1
    if there >= MIN_THERE:
        k = max(1, min(want, there // 4, int(SPAN_S / interval)))
    entry.tat = start + k * interval
    return start, interval, k


@dataclass(slots=True)
class _Block:
    """Tokens of a block: slot ``j`` is ``first + j * interval`` (``j < size``, as
    :func:`take_tokens` computed them); those before ``next`` are used or dropped."""

    shape: tuple[int, float, int]
    first: float
    interval: float
    size: int
    next: int = 1
    used: int = 1

    def use(self, now: float) -> bool:
        """The earliest slot not past at ``now`` used (those before it dropped): whether
        one was. Found by arithmetic, not by stepping over each dropped slot."""
        j, size, first, interval = self.next, self.size, self.first, self.interval
        if j < size and first + j * interval < now:
            j = max(j, min(size, math.ceil((now - first) / interval)))
            while j > self.next and first + (j - 1) * interval >= now:
                j -= 1  # rounding: the very first slot not past, as computed in the take
            while j < size and first + j * interval < now:
                j += 1
        if j >= size:
            self.next = size
            return False
        self.next = j + 1
        self.used += 1
        return True


def _shape(claim: ev.SlotClaim) -> tuple[int, float, int]:
    return (claim.size, claim.per_s or 0.0, claim.burst)


class RateBlocks:
    """This process's blocks of rates' tokens (see the module)."""

    def __init__(self, slots: Slots, clock: Callable[[], str]) -> None:
        self._slots, self._clock = slots, clock
        self._blocks: dict[str, _Block] = {}
        self._taking: dict[str, asyncio.Event] = {}
        self._waiting: dict[str, int] = {}
        """Requests of each key waiting while a block of it is taken (the next is sized
        to serve them too, rather than one block after another for a crowd)."""

    def _use(self, token: str, claim: ev.SlotClaim) -> str | None:
        """A token of a block held here used now (the time it is used at), if one is."""
        block = self._blocks.get(token)
        if block is None or block.next >= block.size or block.shape != _shape(claim):
            return None
        at = self._clock()
        return at if block.use(parse_time(at).timestamp()) else None

    async def take(self, claim: ev.SlotClaim) -> str | None:
        """A token of the rate ``claim`` (one held here, or one or a block taken now, if
        there and nobody waits): the time it is taken at (the admission's), or None."""
        token = entry_key(claim.limit, claim.key)
        while True:
            at = self._use(token, claim)
            if at is not None:
                return at
            taking = self._taking.get(token)
            if taking is None:
                break
            self._waiting[token] = self._waiting.get(token, 0) + 1
            try:
                await taking.wait()  # another request of the key is taking a block
            finally:
                self._waiting[token] -= 1
                if not self._waiting[token]:
                    del self._waiting[token]
        done = self._taking[token] = asyncio.Event()
        try:
            return await self._take(token, claim)
        finally:
            del self._taking[token]
            done.set()

    async def _take(self, token: str, claim: ev.SlotClaim) -> str | None:
        block = self._blocks.pop(token, None)
        want = _want(block, claim, parse_time(self._clock()).timestamp())
        if want > 1:
            want = max(want, self._waiting.get(token, 0) + 1)
        at = ""

        async def change(lines: Lines) -> tuple[float, float, int]:
            # The clock read as the write is made (not before a wait for the entry): the
            # block's slots start then, so fewer of them have gone by once it is taken.
            nonlocal at
            at = self._clock()
            entry = lines.entry
            if entry.lines or entry.waiting:
                return 0.0, 0.0, 0
            entry.size, entry.per_s, entry.burst = claim.size, claim.per_s, claim.burst
            return take_tokens(entry, parse_time(at).timestamp(), want)

        first, interval, size = await self._slots.change(claim, change)
        if not size:
            return None  # none there, or someone waits: the block (if any) is dropped
        if size > 1:
            if len(self._blocks) >= MAX_KEYS:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[token] = _Block(_shape(claim), first, interval, size)
        return at


def _want(block: _Block | None, claim: ev.SlotClaim, now: float) -> int:
    """How many tokens the next block of a key should take: enough for
    :data:`PER_BLOCK` requests at the pace its last block was used (at most four times,
    at least a quarter of, the last one's size); :data:`PER_BLOCK` for a key new here."""
    if claim.burst <= 1:
        return 1
    if block is None or block.shape != _shape(claim):
        return PER_BLOCK
    size = block.size
    return max(2, min(size * 4, max(size // 4, size * PER_BLOCK // max(block.used, 1))))
