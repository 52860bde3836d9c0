"""How the slots bucket keeps one limit and key: a small entry, and a line per fairness key.

The entry (bucket key ``<limit hash>.<key hash>``) holds the runs holding a slot, each
fairness key's recent use of the slots (:mod:`slotuse`) and, per fairness key with runs
waiting, that line's outline: its weight and its segments, each with its count, its oldest
wait, its last place and how many of its waiters are early (:meth:`Lines.find`). The
first waiters of each line (up to
:data:`HEAD`) are kept in the entry itself (``waiting``); the rest are in the segments
(``<entry key>.<fairness key hash>.<n>``), at most :data:`SEGMENT` each, in line order
(higher priority first, then the earlier queued, then run id). A run leaving the head of a
line, as each slot handed on does, rewrites the entry alone, and one segment too only when
the head is taken from it (:data:`HEAD` at a time); a run entering a long line rewrites one
segment and the entry, never the whole line, and a line holds as many runs as there are
segments. A write of one key is a plain compare-and-set; one of several is an atomic
batch, which the server stores some 5 to 20 times slower (it is flushed before it is
acknowledged): handing a slot on in one key is what keeps a line's pace close to its
runs' own.

Every change rewrites the entry, so the entry's revision orders every change of the limit
and key: a change writes the entry and the segments it touched in one atomic batch, each
only if unchanged since read (:func:`interlock.transport.kvbatch.put_all`), and a change
made from a stale read is refused whole and done again.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import operator
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from interlock.runtime.foreign import foreign_value
from interlock.runtime.slotuse import Use
from interlock.transport.kvread import read_key

SEGMENT = 200
"""The most waiters one segment holds (some 14 kB)."""
STRIDE = 720_720
"""What a line of weight 1 advances per slot it is given (divisible by 1 to 16)."""
MAX_LINES = 256
"""The most fairness keys with a line of their own in one limit and key. Fairness keys
are read from what starts a run (an event's data: whatever its publisher wrote), and the
entry outlines every line, up to some 2 kB each: without a bound, some 3,000 runs of
distinct keys made the entry larger than the server takes, and no change of it (another
key's run joining, a holder's end freeing its slot) could be written again. The runs of
keys beyond these wait in one line of their own, :data:`OTHERS`."""
OTHERS = "(other keys)"
"""The fairness key of the line the runs of keys past :data:`MAX_LINES` share (each
keeps its own key; a real key of this text shares the line, which changes nothing)."""
HEAD = 16
"""The first waiters of a line kept in the entry (not in :data:`OTHERS`'s line)."""
INLINE = 128
"""The most waiters kept in one entry, all lines together (some 10 kB)."""
GONE_KEPT_S = 900
"""How long the marker of a deleted entry or segment stays (its message's TTL): long past
a sweep's round, so every process reads the deletion; kept for good, the markers of keys
named once (a publisher can name a new one in every event) grew the bucket, and every
read of it, without bound."""


class Waiter(msgspec.Struct, array_like=True, frozen=True):
    run_id: str
    since: str
    """When the run joined (RFC 3339)."""
    size: int
    """The limit as the run's workflow declares it: it holds a slot only while fewer runs
    than that do."""
    priority: int = 0
    """In line, a higher priority goes first, then the earlier ``since``."""
    fair: str = ""
    """The run's fairness key: the keys share the slots (see :func:`pick`)."""
    weight: int = 1
    """The weight of its fairness key: its share of the slots against the other keys'."""
    early: int = 0
    """1: a holder that took its slot before the record asking for it was appended (see
    :mod:`interlock.runtime.atonce`): until a sweep finds that record, it may be in no log."""


def order(waiter: Waiter) -> tuple[int, str, str]:
    return -waiter.priority, waiter.since, waiter.run_id


class Segment(msgspec.Struct, array_like=True):
    """One segment of a line, as the entry outlines it."""

    id: int
    count: int
    oldest: str
    """The earliest ``since`` of its waiters."""
    last: tuple[int, str, str]
    """The line order of its last waiter."""
    early: int = 0
    """How many of its waiters are marked ``early`` (in line before any log asked): where
    a run started again under a later time may find its earlier place (see :meth:`Lines.find`)."""


class Line(msgspec.Struct, array_like=True):
    """The runs of one fairness key waiting."""

    fair: str
    weight: int
    segments: list[Segment]
    next: int = 0
    """The id the next new segment takes."""
    passed: int = 0
    """Its progress in the weighted turns: :data:`STRIDE` over its weight more for each
    slot it was given (the line furthest behind is served first among equals)."""

    @property
    def count(self) -> int:
        return sum(s.count for s in self.segments)


class SlotEntry(msgspec.Struct, kw_only=True):
    """The holders of one limit and key, and the outline of its lines."""

    limit: str
    key: str
    size: int
    """The limit as the run that joined last declares it (what listings show)."""
    holders: list[Waiter] = []
    waiting: list[Waiter] = []
    """The first waiters of the lines (:data:`HEAD` each at most), in line order: each
    line's are before its segments' waiters. (Entries written before lines kept every
    waiter here, outlining no line: those are moved into lines at the next change.)"""
    turn: str = ""
    """The fairness key served last (keys holding as many slots take turns after it)."""
    lines: list[Line] = []
    admitted: int = 0
    """Slots taken so far (every admission; what recent use decays by)."""
    used: list[Use] = []
    """Each fairness key's recent use of the slots (:mod:`slotuse`): fair share serves a
    key that used few lately first. (Entries written before kept none: all count 0.)"""
    per_s: float = 0.0
    """A capability's rate limit: ``size`` tokens per this many seconds (0: slots). Its
    holders hold a token until their admission is read; its lines go as tokens come."""
    burst: int = 0
    tat: float = 0.0
    """A rate's theoretical arrival time (GCRA, seconds since the epoch): its next token
    is there from ``tat - (burst - 1) * per_s / size``; 0: every token is there."""

    @property
    def queued(self) -> int:
        return sum(line.count for line in self.lines) + len(self.waiting)

    @property
    def oldest(self) -> str | None:
        """The earliest time a run now waiting joined."""
        times = [s.oldest for line in self.lines for s in line.segments]
        times += [w.since for w in self.waiting]
        return min(times) if times else None

    def holds(self, run_id: str) -> bool:
        for holder in self.holders:  # noqa: SIM110 (a generator costs twice as much a holder)
            if holder.run_id == run_id:
                return True
        return False


encode = msgspec.json.Encoder().encode
_decode_segment = msgspec.json.Decoder(list[Waiter]).decode


@functools.lru_cache(maxsize=256)
def _early_ids(value: bytes) -> frozenset[str]:
    """The runs marked ``early`` in a stored segment (none in one that is not a segment).
    Kept per value: a segment a flood does not change is decoded once, not once per run
    entering its line (a stored value keeps its hash, so a lookup costs next to nothing)."""
    try:
        return frozenset(w.run_id for w in _decode_segment(value) if w.early) if value else EMPTY
    except msgspec.DecodeError:
        return EMPTY


EMPTY: frozenset[str] = frozenset()
_early_mark = operator.attrgetter("early")


@functools.lru_cache(maxsize=4096)
def entry_key(limit: str, key: str) -> str:
    """The bucket key of a limit and key (hashed: keys are any text; remembered, as every
    take and free of a limit asks it)."""
    first = hashlib.sha256(limit.encode()).hexdigest()[:16]
    second = hashlib.sha256(f"{limit}\0{key}".encode()).hexdigest()[:32]
    return f"{first}.{second}"


ENTRIES = "*.*"
"""The bucket keys of the entries (segments have two tokens more)."""


def segment_key(token: str, fair: str, segment: int) -> str:
    return f"{token}.{_fair_token(fair)}.{segment}"


@functools.lru_cache(maxsize=4096)
def _fair_token(fair: str) -> str:
    """A fairness key's part of its segments' keys (remembered: a run looking for its
    place may name every segment of its line)."""
    return hashlib.sha256(fair.encode()).hexdigest()[:16]


class Lines:
    """One limit and key as read for a change: the entry, the segments read so far, and
    what the change wrote (to be written back by :meth:`writes`)."""

    def __init__(
        self,
        kv: Any,
        bucket: str,
        token: str,
        entry: SlotEntry,
        revision: int,
        read: Callable[[str], Awaitable[tuple[bytes, int]]] | None = None,
        before: bytes | None = None,
    ) -> None:
        """``before``: what ``entry`` encodes to, when known."""
        self._kv, self._bucket, self.token = kv, bucket, token
        self._read = read or (lambda key: read_key(kv, key))
        self.entry, self.revision = entry, revision
        self._before = encode(entry) if before is None else before
        self._segments: dict[str, tuple[list[Waiter], int]] = {}
        self._dirty: set[str] = set()

    # -- reading ---------------------------------------------------------------------

    def line(self, fair: str) -> Line | None:
        return next((line for line in self.entry.lines if line.fair == fair), None)

    def _lines_of(self, fair: str) -> list[Line]:
        """The lines a run of ``fair`` may wait in: its key's own, then the others'."""
        own, others = self.line(fair), self.line(OTHERS)
        return [line for line in (own, others if others is not own else None) if line]

    def inline(self, line: Line) -> list[Waiter]:
        """The first waiters of ``line``, kept in the entry, in order."""
        if line.fair == OTHERS:
            return []
        return [w for w in self.entry.waiting if w.fair == line.fair]

    def _keep_inline(self, waiters: list[Waiter]) -> None:
        for waiter in waiters:
            bisect.insort(self.entry.waiting, waiter, key=order)

    def _drop_inline(self, line: Line, run_id: str) -> bool:
        """Take the run out of the line's head kept in the entry; whether it was there."""
        if line.fair == OTHERS:
            return False
        for i, waiter in enumerate(self.entry.waiting):
            if waiter.run_id == run_id and waiter.fair == line.fair:
                del self.entry.waiting[i]
                self._forget_if_empty(line)
                return True
        return False

    def _outlined(self, waiter: Waiter) -> bool:
        """Whether the entry outlines a line of the waiter's own key (else it waits in
        the others' line, or was kept before lines)."""
        line = self.line(waiter.fair)
        return line is not None and line.fair != OTHERS

    def _forget_if_empty(self, line: Line) -> None:
        if not line.segments and not self.inline(line) and line in self.entry.lines:
            self.entry.lines.remove(line)

    async def segment(self, fair: str, segment: Segment) -> list[Waiter]:
        """A segment's waiters (read once, then as changed here)."""
        key = segment_key(self.token, fair, segment.id)
        held = self._segments.get(key)
        if held is None:
            return self._decoded(key, *(await self._read(key)))
        return held[0]

    def _decoded(self, key: str, value: bytes, revision: int) -> list[Waiter]:
        """A segment as read (``value`` at ``revision``), decoded and kept."""
        try:
            waiters = _decode_segment(value) if value else []
        except msgspec.DecodeError:
            foreign_value(self._bucket, key, "not a slots segment", revision)
            waiters = []
        self._segments[key] = (waiters, revision)
        return waiters

    async def find(self, waiter: Waiter) -> int | None:
        """The run's place in its line (1: next), found where the waiter's order puts it,
        or (a run started again under a later time, after a process that put it in line
        died before its append) at an earlier place of its own, marked ``early``; None
        when it is not there.

        The head kept in the entry is looked through whole; of the segments, the one the
        order points at, then those holding early waiters (a waiter put in line from a
        log has that log's time, so it is where its order puts it)."""
        looked: set[int] = set()
        for line in self._lines_of(waiter.fair):
            inline = self.inline(line)
            for i, other in enumerate(inline):
                if other.run_id == waiter.run_id:
                    return i + 1
            before = len(inline)
            for segment in line.segments:
                if segment.last >= order(waiter):
                    looked.add(id(segment))
                    found = await self.segment(line.fair, segment)
                    for i, other in enumerate(found):
                        if other.run_id == waiter.run_id:
                            return before + i + 1
                    break
                before += segment.count
        return await self._find_early(waiter.run_id, waiter.fair, looked)

    async def _find_early(self, run_id: str, fair: str, looked: set[int]) -> int | None:
        """The run's place among the early waiters of the segments not ``looked`` at.
        In a flood of runs started by orchestrators most segments hold early waiters, and
        each run entering the line looks: a segment as stored is looked up in the set of
        its early waiters (:func:`_early_ids`, kept per stored value), decoded only when
        the run is there."""
        for line in self._lines_of(fair):
            before = len(self.inline(line))
            for segment in line.segments:
                if segment.early and id(segment) not in looked:
                    key = segment_key(self.token, line.fair, segment.id)
                    held = self._segments.get(key)
                    if held is None:
                        value, revision = await self._read(key)
                        if run_id not in _early_ids(value):
                            before += segment.count
                            continue
                        held = (self._decoded(key, value, revision), revision)
                    for i, other in enumerate(held[0]):
                        if other.run_id == run_id:
                            return before + i + 1
                before += segment.count
        return None

    async def place(self, run_id: str, fair: str, *, segments: int = 1 << 30) -> int | None:
        """The run's place in the line of ``fair`` (1: next), looked for in each segment,
        the first ``segments`` read at most (None: not found there)."""
        for line in self._lines_of(fair):
            inline = self.inline(line)
            for i, other in enumerate(inline):
                if other.run_id == run_id:
                    return i + 1
            before = len(inline)
            for segment in line.segments[: max(segments, 0)]:
                segments -= 1
                for i, other in enumerate(await self.segment(line.fair, segment)):
                    if other.run_id == run_id:
                        return before + i + 1
                before += segment.count
        return None

    # -- changing --------------------------------------------------------------------

    def _store(self, line: Line, segment: Segment, waiters: list[Waiter]) -> None:
        key = segment_key(self.token, line.fair, segment.id)
        self._segments[key] = (waiters, self._segments.get(key, ([], 0))[1])
        self._dirty.add(key)
        if waiters:
            segment.count = len(waiters)
            segment.oldest = min(w.since for w in waiters)
            segment.last = order(waiters[-1])
            segment.early = sum(map(_early_mark, waiters))
        else:
            line.segments.remove(segment)
            self._forget_if_empty(line)

    async def insert(self, waiter: Waiter) -> int:
        """Put the waiter in its line, in order; its place there."""
        line = self.line(waiter.fair)
        if line is None and len(self.entry.lines) >= MAX_LINES:
            line = self.line(OTHERS)
        if line is None:
            # A line that starts (again) is as far on as the furthest behind: it is owed
            # nothing for the time it had nobody waiting.
            behind = min((other.passed for other in self.entry.lines), default=0)
            fair = waiter.fair if len(self.entry.lines) < MAX_LINES else OTHERS
            line = Line(fair=fair, weight=waiter.weight, segments=[], passed=behind)
            self.entry.lines.append(line)
            self.entry.lines.sort(key=lambda found: found.fair)
        if line.fair == waiter.fair:
            line.weight = waiter.weight
        else:
            line.weight = 1  # the others' line: no one key's weight
        inline = self.inline(line)
        room = len(inline) < HEAD and len(self.entry.waiting) < INLINE
        if line.fair == waiter.fair != OTHERS and (
            (room and not line.segments) or (inline and order(waiter) < order(inline[-1]))
        ):
            # Into the head kept in the entry; its last goes back to the segments if the
            # head is full (or the entry is).
            self._keep_inline([waiter])
            if not room:
                self.entry.waiting.remove(inline[-1])
                await self._into_segments(line, inline[-1])
            return bisect.bisect(inline, order(waiter), key=order) + 1
        return len(inline) + await self._into_segments(line, waiter)

    async def _into_segments(self, line: Line, waiter: Waiter) -> int:
        """Put the waiter in the segments of its line, in order; its place among them."""
        at = next((s for s in line.segments if s.last >= order(waiter)), None)
        at = at or (line.segments[-1] if line.segments else None)
        if at is None or (at.count >= SEGMENT and at.last < order(waiter)):
            at = Segment(id=line.next, count=0, oldest=waiter.since, last=order(waiter))
            line.next += 1
            line.segments.append(at)
        waiters = list(await self.segment(line.fair, at))
        i = bisect.bisect(waiters, order(waiter), key=order)
        waiters.insert(i, waiter)
        before = sum(s.count for s in line.segments[: line.segments.index(at)])
        if len(waiters) > SEGMENT:  # split: the later half into a new segment after it
            half = len(waiters) // 2
            later = Segment(id=line.next, count=0, oldest="", last=order(waiters[-1]))
            line.next += 1
            line.segments.insert(line.segments.index(at) + 1, later)
            await self.segment(line.fair, later)  # (a delete marker's revision, if any)
            self._store(line, later, waiters[half:])
            waiters = waiters[:half]
        self._store(line, at, waiters)
        return before + i + 1

    async def head(self, line: Line) -> Waiter:
        inline = self.inline(line)
        return inline[0] if inline else (await self.segment(line.fair, line.segments[0]))[0]

    async def pop_head(self, line: Line) -> Waiter:
        """The first waiter of the line, taken out: from the head kept in the entry (the
        entry alone is written), else from the first segment, whose next waiters then
        move into the entry while that segment is written anyway."""
        inline = self.inline(line)
        if inline:
            self._drop_inline(line, inline[0].run_id)
            return inline[0]
        segment = line.segments[0]
        waiters = list(await self.segment(line.fair, segment))
        first = waiters.pop(0)
        if line.fair != OTHERS:
            room = max(min(HEAD, INLINE - len(self.entry.waiting)), 0)
            self._keep_inline(waiters[:room])
            waiters = waiters[room:]
        self._store(line, segment, waiters)
        return first

    async def remove(self, run_id: str, fair: str) -> bool:
        """Take the run out of the line of ``fair``; whether it was there."""
        for line in self._lines_of(fair):
            if self._drop_inline(line, run_id):
                return True
            for segment in list(line.segments):
                waiters = await self.segment(line.fair, segment)
                if any(w.run_id == run_id for w in waiters):
                    self._store(line, segment, [w for w in waiters if w.run_id != run_id])
                    return True
        return False

    async def take_all(self) -> list[Waiter]:
        """Every waiter out of every line, each line in its order."""
        out: list[Waiter] = []
        for line in list(self.entry.lines):
            out += self.inline(line)
            self.entry.waiting = [w for w in self.entry.waiting if w not in out]
            for segment in list(line.segments):
                out += await self.segment(line.fair, segment)
                self._store(line, segment, [])
            self._forget_if_empty(line)
        return out

    async def upgrade(self) -> None:
        """Waiters kept in the entry whose line it does not outline (as entries written
        before lines kept them all) moved into lines."""
        entry = self.entry
        stray = [w for w in entry.waiting if not self._outlined(w)]
        if not stray:
            return
        entry.waiting = sorted((w for w in entry.waiting if w not in stray), key=order)
        for waiter in sorted(stray, key=order):
            await self.insert(waiter)

    def writes(self) -> list[tuple[str, bytes | None, int]]:
        """What to write back: the entry (deleted when nobody holds or waits) and the
        segments changed, each with the revision read; nothing when nothing changed."""
        after = encode(self.entry)
        if after == self._before and not self._dirty:
            return []
        entry = self.entry
        empty = not entry.holders and not entry.lines and not entry.waiting and not entry.tat
        out: list[tuple[str, bytes | None, int]] = []
        if not empty or self.revision:
            out.append((self.token, None if empty else after, self.revision))
        for key in sorted(self._dirty):
            waiters, revision = self._segments[key]
            if waiters:
                out.append((key, encode(waiters), revision))
            elif revision:
                out.append((key, None, revision))
        return out
