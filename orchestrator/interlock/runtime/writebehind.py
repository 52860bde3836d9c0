"""The relay's write-behind: run-index entries written once for short runs, not per record,
and action deadlines that the answer beats never scheduled at all.

Writing a run's index entry at every record the relay reads costs one stream write per
start, state change and end; most runs start and end within a fraction of a second, and
only their last entry is ever read. So the relay hands each run's records here once their
other effects are done, and their messages are acknowledged only after the entry that
reflects them is written:

- a run that has finished, or that waits for something from outside (an event, a person,
  a timer: no action of its own in flight), is written at the next flush (a few tens of
  milliseconds);
- a run still going is written once it has been held ``hold`` seconds (a run waiting for
  a person, a long task), then again at most every ``hold`` seconds while it changes.

A run that starts and ends within ``hold`` is written once. Timers due well after
``hold`` (an action's deadline, mostly) wait with the run's messages too, and are scheduled
at the flush only if the run still holds them: a deadline the answer beat costs no write
when it is set and none when it would have fired. Nothing is lost in a crash: the messages
not yet acknowledged come again to whichever process relays next, and their entry (which
only moves forward, see :mod:`runindex`) and timers are written then.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from nats.aio.msg import Msg

from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time
from interlock.runtime.runindex import RunIndex
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.natsclient import ack_nowait

log = logging.getLogger("interlock.orchestrator")

HOLD = 2.0
"""Seconds a running run's index changes are held before they are written."""
MARGIN = 2.0
"""Seconds a deferred timer is at least due after ``hold`` (a flush may be slow)."""
TICK = 0.02
"""Seconds between flushes while something is held (finished or waiting runs wait at most
this)."""
SLICE = 0.0002
"""Seconds a flush works at least before it lets the event loop run what came meanwhile
(a run's next step): see :class:`_Share`."""
FINISHING = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunContinued)

Done = Callable[[str, list[ev.AnyRecord]], None]
"""Called with a run and the records whose messages were just acknowledged."""
Schedule = Callable[[ev.TimerScheduled], Awaitable[None]]
"""Schedules a timer (its durable write)."""
Stale = Callable[[str, str], bool]
"""Whether the run (first argument) is known to no longer hold the timer (second)."""


@dataclass
class _Held:
    since: float
    records: list[ev.AnyRecord] = field(default_factory=list)
    """The records the relay acted on (what the index entry is made of)."""
    reported: list[ev.AnyRecord] = field(default_factory=list)
    """Every record of the held messages (what observers are told once acknowledged)."""
    msgs: list[Msg] = field(default_factory=list)
    timers: list[ev.TimerScheduled] = field(default_factory=list)
    """Timers to schedule at the flush, unless the run no longer holds them by then."""
    finished: bool = False
    """Finished or waiting: written at the next flush."""


class WriteBehind:
    """Holds relayed run-log messages until their run's index entry is written."""

    def __init__(
        self,
        index: RunIndex,
        done: Done,
        *,
        schedule: Schedule | None = None,
        stale: Stale | None = None,
        hold: float = HOLD,
        tick: float = TICK,
    ) -> None:
        self._index = index
        self._done = done
        self._schedule = schedule
        self._stale = stale
        self.hold = hold
        self.tick = tick
        self._held: dict[str, _Held] = {}
        """In the order runs were first held (the oldest first)."""
        self._finishing: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        """What the flush loop awaits between flushes (None: it is flushing)."""
        self._timer: asyncio.TimerHandle | None = None
        """Wakes the flush loop for its next flush."""
        self._timer_at = 0.0
        """When ``_timer`` rings (``time.monotonic()``)."""
        self._stopping = False
        """Set by :meth:`stop`: the flush loop ends at its next turn (even if its
        cancellation was lost)."""

    @property
    def holding(self) -> int:
        """Runs whose messages are held."""
        return len(self._held)

    def holds(self, run_id: str) -> bool:
        """Whether messages of the run are held (later ones join them, in order)."""
        return run_id in self._held

    def defers(self, record: ev.TimerScheduled, now: datetime) -> bool:
        """Whether the timer may wait for the flush: it is due well after ``hold``."""
        if self._schedule is None:
            return False
        try:
            fire_at = parse_time(record.data.fire_at)
            return fire_at - now > timedelta(seconds=self.hold + MARGIN)
        except (ValueError, TypeError):  # unreadable or naive: schedule it now
            return False

    def add(
        self,
        run_id: str,
        records: Sequence[ev.AnyRecord],
        reported: Sequence[ev.AnyRecord],
        msgs: Sequence[Msg],
        timers: Sequence[ev.TimerScheduled] = (),
    ) -> None:
        """Hold a run's messages (their other effects done) until its entry is written
        and ``timers`` are scheduled."""
        # The flush loop, while it waits, is woken by a timer set for the next entry due;
        # while it flushes (or before it starts), it sets that timer itself when done.
        waiting = self._waiter is not None
        held = self._held.get(run_id)
        if held is None:
            held = self._held[run_id] = _Held(time.monotonic())
            if waiting:
                self._wake_in(self.hold + self.tick)
        held.records.extend(records)
        held.reported.extend(reported)
        held.msgs.extend(msgs)
        held.timers.extend(timers)
        if not held.finished and leaves(records):
            held.finished = True
            self._finishing.add(run_id)
            if waiting:
                self._wake_in(self.tick)  # let a few more finish: one flush writes them all
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def _next_due(self) -> float | None:
        """Seconds until some entry is due (None: nothing is held)."""
        if self._finishing:
            return 0.0
        for held in self._held.values():
            return max(0.0, held.since + self.hold - time.monotonic())
        return None

    def _wake_in(self, delay: float) -> None:
        """Have the waiting flush loop flush in ``delay`` seconds at the latest (a timer,
        not a wake-up now: the loop wakes once per flush)."""
        at = time.monotonic() + delay
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(delay, self._ring)

    def _ring(self) -> None:
        self._timer = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._waiter = loop.create_future()
            wait = self._next_due()
            if wait is not None:
                # Due already (finishing runs that came during the last flush): a tick more.
                self._wake_in(wait + self.tick)
            try:
                await self._waiter
            finally:
                self._waiter = None
            try:
                await self.flush()
            # A failed flush leaves its messages unacknowledged: they come again.
            except Exception as exc:  # noqa: BLE001
                log.warning("relay: write-behind flush failed: %s", exc)

    async def flush(self, *, everything: bool = False) -> None:
        """Write the entries that are due (all of them with ``everything``), then
        acknowledge their messages."""
        now = time.monotonic()
        due = list(self._finishing)
        for run_id, held in self._held.items():
            if not everything and now - held.since < self.hold:
                break  # the rest were held later still
            if not held.finished:
                due.append(run_id)
        self._finishing.clear()
        if not due:
            return
        taken = [(run_id, self._held.pop(run_id)) for run_id in due]
        share = _Share()
        outcomes = await self._settle_all(taken, share)
        for (run_id, held), outcome in zip(taken, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning(
                    "relay: run index entry of %s not written, will redo: %s", run_id, outcome
                )
                for msg in held.msgs:
                    # Best effort: a message left unsettled comes again after its ack wait.
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=1)
                continue
            try:
                for msg in held.msgs:
                    if not ack_nowait(msg):
                        await msg.ack()
            # It comes again, and is reported then.
            except Exception as exc:  # noqa: BLE001
                log.warning("relay: cannot acknowledge run %s: %s", run_id, exc)
                continue
            self._done(run_id, held.reported)
            # What came meanwhile (a run's next step) goes between the reports rather
            # than after the whole flush.
            await share.pause()

    async def _settle_all(
        self, taken: list[tuple[str, _Held]], share: _Share
    ) -> list[BaseException | None]:
        """Write each run's entry (and schedule its timers): the writes that need nothing
        first are sent at once and their acknowledgements awaited in turn, the others
        (timers to schedule, an entry to read first) each in a task of its own. What
        failed, by run (None: written)."""
        outcomes: list[BaseException | None] = [None] * len(taken)
        sent: list[tuple[int, Awaitable[None]]] = []
        other: list[tuple[int, Awaitable[None]]] = []
        try:
            for i, (run_id, held) in enumerate(taken):
                if held.timers:
                    other.append((i, self._settle(run_id, held)))
                    continue
                await share.pause()  # as the reports below
                write = self._index.update_soon(run_id, held.records)
                if write is not None:
                    (sent if write[1] else other).append((i, write[0]))
            if other:
                gathered, other = other, []  # each in a task now, run to its end
                done = await asyncio.gather(*(w for _, w in gathered), return_exceptions=True)
                for (i, _), outcome in zip(gathered, done, strict=True):
                    outcomes[i] = outcome if isinstance(outcome, BaseException) else None
            while sent:
                i, written = sent.pop(0)
                try:
                    await written
                # Its messages are handed back: they come again.
                except Exception as exc:  # noqa: BLE001
                    outcomes[i] = exc
        finally:
            # Cut short (a stop out of time): the writes never awaited are dropped, their
            # messages left unacknowledged (they come again).
            for _, unawaited in (*other, *sent):
                if inspect.iscoroutine(unawaited):
                    unawaited.close()
        return outcomes

    async def _settle(self, run_id: str, held: _Held) -> None:
        for timer in held.timers:
            if self._stale is not None and self._stale(run_id, timer.data.timer_id):
                continue  # answered (or its state left) before it was ever scheduled
            assert self._schedule is not None
            await self._schedule(timer)
        await self._index.update(run_id, held.records)

    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Write and acknowledge what is held (best effort: what is not comes again)."""
        self._stopping = True
        await cancel_and_wait(self._task)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(everything=True), timeout)


class _Share:
    """A flush's share of the event loop: it lets the loop run what came meanwhile once it
    has worked ``SLICE``, or as long as the loop's last turn took, if longer. Under load a
    turn of the loop takes milliseconds; a flush giving way every ``SLICE`` regardless
    got one entry written per turn, fell behind the runs coming in, and held their
    messages past their acknowledgement wait (each then came again). Taking as long as
    the loop took keeps a flush at half the process at most and at least, however busy."""

    __slots__ = ("_slice", "_turn")

    def __init__(self) -> None:
        self._turn = time.perf_counter()
        self._slice = SLICE

    async def pause(self) -> None:
        """Give way to the event loop, if this flush has had its share."""
        now = time.perf_counter()
        if now - self._turn < self._slice:
            return
        await asyncio.sleep(0)
        self._turn = time.perf_counter()
        self._slice = max(SLICE, self._turn - now)


def waits_outside(records: Sequence[ev.AnyRecord]) -> bool:
    """Whether these records leave the run in a state that requested no action: it waits
    for an event, a person or a timer, likely longer than the hold."""
    waiting = False
    for record in records:
        if isinstance(record, ev.StateEntered):
            waiting = True
        elif isinstance(record, ev.ActionRequested):
            waiting = False
    return waiting


_ENDS = frozenset(FINISHING)


def leaves(records: Sequence[ev.AnyRecord]) -> bool:
    """Whether these records end the run or leave it waiting for something from outside
    (what is written at the next flush): ``any(isinstance(r, FINISHING) for r in records)
    or waits_outside(records)``, in one pass over the records by their type."""
    waiting = False
    for record in records:
        kind = type(record)
        if kind in _ENDS:
            return True
        if kind is ev.StateEntered:
            waiting = True
        elif kind is ev.ActionRequested:
            waiting = False
    return waiting
