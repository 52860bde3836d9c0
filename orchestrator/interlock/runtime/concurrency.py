"""Concurrency limits of runs: who holds a slot of each limit and key, and who waits.

The run logs are the truth. A run of a limited workflow starts queued (``run.queued``,
naming the limit and key of each slot it needs); it holds its slots from ``run.admitted``
until the record that ends it (completed, failed, cancelled, timed out). The slots bucket
keeps, per limit and key, the holders and a line of waiters per fairness key
(:mod:`slotlines`): a cache of what the logs say, changed only by compare-and-set, so that
two orchestrator replicas can never both give away the last slot (the second write finds a
newer revision, reads again and decides again). A stale read costs a retry, never an
extra holder.

Every change is made by the relay acting on a record it has read from the run logs, and
each change repeats safely (a run already holding or waiting is left where it is; a run
already gone is not removed twice). The relay acknowledges a record only once its effect
is done, so an orchestrator killed half way through has the record handed to another (or
to itself, restarted), which does it again: a slot given whose run was not yet admitted is
admitted then, a run ended whose slot was not yet freed frees it then. The bucket holds a
run as holder from before its ``run.admitted`` until after its end record, so the runs
whose logs show them admitted and not ended never outnumber the limit.

Slots are taken in the order of the limits' names, whatever order a workflow declares
them in, so runs of workflows that share limits cannot hold one each of two and wait for
each other's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.js.errors import KeyWrongLastSequenceError

from interlock.core import events as ev
from interlock.core.limitdef import CAPABILITY_LIMIT
from interlock.core.pauses import PAUSED, is_pause, pause_claim
from interlock.runtime import slotlines
from interlock.runtime.errors import UnknownRun, UnknownWorkflow
from interlock.runtime.pausing import Pauses
from interlock.runtime.runs import Runs
from interlock.runtime.slotlines import ENTRIES, Lines, SlotEntry, Waiter, entry_key, order
from interlock.runtime.slotroom import crowded, room
from interlock.runtime.slotstore import Written, decode_entry
from interlock.runtime.slotturns import admit, grant, let_go_all, urgent_first
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.jetstream import jetstream
from interlock.transport.kvbatch import put_all
from interlock.transport.kvread import read_key, scan_bucket
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.concurrency")

Change = Callable[[Lines], Awaitable[Any]]
"""A change of one limit and key: what it gives back is told to whoever asked it."""

__all__ = ["Admission", "Entered", "SlotEntry", "Slots", "Waiter", "entry_key", "in_order"]

MAX_TRIES = 64
"""Compare-and-set attempts on one entry before giving up (the relay then redoes it)."""


@dataclass(frozen=True, slots=True)
class Entered:
    """Where :meth:`Slots.enter` left a run: holding a slot, waiting at ``place``, or
    (``skipped``) neither, the limit being full; ``evict``: the holder to cancel."""

    held: bool
    place: int = 0
    skipped: bool = False
    crowded: bool = False
    """Skipped because the lines hold as many as they may (``slotroom.crowded``; ``place``:
    how many wait)."""
    evict: str | None = None
    others: tuple[str, ...] = ()
    """Other runs moved into slots meanwhile (to be taken further)."""


class Slots:
    """The slots bucket: each change a compare-and-set of one limit and key (its entry and
    the segments of its lines it touched, see :mod:`slotlines`)."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._js = jetstream(nc)
        self._subjects = subjects
        self._kv: Any = None
        self._known: dict[str, tuple[bytes, int]] = {}
        """The keys this process wrote or read last, with their revisions: the next change
        starts from them instead of reading (a stale one makes the write fail, and the
        change is done again from fresh reads; a change that writes nothing is checked
        against fresh reads before it is believed)."""
        self._written = Written()
        self._urgent: set[asyncio.Future[Any]] = set()  # (see slotturns.urgent_first)
        self._pending: dict[str, list[tuple[Change, asyncio.Future[Any]]]] = {}
        """Per entry being written by this process, the changes asked meanwhile: one entry
        is changed by one write at a time here (a busy line read and written by many runs'
        effects at once lost most of its compare-and-sets to itself); other processes race
        by revision."""

    async def _bucket(self) -> Any:
        if self._kv is None:
            self._kv = await self._js.key_value(self._subjects.slots_bucket)
        return self._kv

    async def lines(self, limit: str, key: str) -> Lines | None:
        """One limit and key as stored (its segments read on demand); None: nobody holds
        or waits."""
        kv = await self._bucket()
        token = entry_key(limit, key)
        value, revision = await read_key(kv, token)
        entry = decode_entry(self._subjects.slots_bucket, token, value, revision)
        return (
            None
            if entry is None
            else Lines(kv, self._subjects.slots_bucket, token, entry, revision)
        )

    async def read(self, limit: str, key: str) -> SlotEntry | None:
        found = await self.lines(limit, key)
        return None if found is None else found.entry

    async def entries(self) -> list[SlotEntry]:
        """Every limit and key with a holder or a waiter (read without a consumer)."""
        found = {token: entry async for token, entry in self.scan()}
        return [entry for entry in found.values() if entry is not None]

    async def scan(self) -> AsyncIterator[tuple[str, SlotEntry | None]]:
        """Each limit and key as stored (None: gone, or no entry), a bounded batch of the
        bucket at a time (see ``kvread.scan_bucket``): an entry outlines up to 256 lines
        of keys a publisher names, so what reads them all keeps what it makes of each."""
        bucket = self._subjects.slots_bucket
        async for _, token, value in scan_bucket(await self._bucket(), ENTRIES):
            yield token, decode_entry(bucket, token, value)

    async def written_after(
        self, after: int, keep: Callable[[SlotEntry], bool]
    ) -> tuple[dict[str, SlotEntry | None], int]:
        """Entries written after revision ``after``, those ``keep`` takes (None: gone, or
        not taken), and the revision read; read a bounded batch at a time."""
        found: dict[str, SlotEntry | None] = {}
        through, bucket = after, self._subjects.slots_bucket
        async for revision, token, value in scan_bucket(await self._bucket(), ENTRIES, after):
            entry = decode_entry(bucket, token, value)
            found[token] = entry if entry is not None and keep(entry) else None
            through = max(through, revision)
        return found, through

    async def change(
        self, claim: ev.SlotClaim, change: Change, token: str = "", *, urgent: bool = False
    ) -> Any:
        """``change`` applied to the claim's limit and key (or the entry ``token``), and
        written back if nothing of it changed since read (else read again and done again).

        The changes this process asks of one entry while a write of it is out are made
        together, in the order asked, in the next read and write: a busy line (a flood of
        runs entering it) costs a write per batch, not a write per run. ``urgent`` changes
        (a slot taken or handed on) go in a write of their own before the others
        (:func:`slotturns.urgent_first`)."""
        token = token or entry_key(claim.limit, claim.key)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        pending = self._pending.get(token)
        if pending is not None:
            pending.append((change, done))
            if urgent:
                self._urgent.add(done)
            return await done
        batch: list[tuple[Change, asyncio.Future[Any]]] = [(change, done)]
        self._pending[token] = batch
        try:
            deferred = 0
            while batch:
                batch, self._pending[token] = urgent_first(batch, self._urgent, deferred)
                deferred = deferred + 1 if self._pending[token] else 0
                kv = await self._bucket()
                try:
                    results = await self._change_held(kv, token, claim, batch)
                # Each asker is told (the relay redoes its effect); the next batch goes on.
                except Exception as exc:  # noqa: BLE001
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future), result in zip(batch, results, strict=True):
                        if not future.done():
                            future.set_result(result)
                batch = self._pending[token]
        finally:
            # Stopped half way (cancelled): nobody is left waiting for good.
            for _, future in [*batch, *self._pending.pop(token)]:
                self._urgent.discard(future)
                if not future.done():
                    future.set_exception(RuntimeError("the change of the slots was stopped"))
                    future.exception()  # its asker may be stopping too: not reported unread
        return await done

    async def _change_held(
        self,
        kv: Any,
        token: str,
        claim: ev.SlotClaim,
        batch: list[tuple[Change, asyncio.Future[Any]]],
    ) -> list[Any]:
        bucket = self._subjects.slots_bucket
        known = self._known
        for attempt in range(MAX_TRIES):
            used: set[str] = set()
            cached = attempt == 0

            async def read(
                key: str, cached: bool = cached, used: set[str] = used
            ) -> tuple[bytes, int]:
                found = known.get(key) if cached else None
                if found is None:
                    found = known[key] = await read_key(kv, key)
                else:
                    used.add(key)
                return found

            value, revision = await read(token)
            entry, before = self._written.take(token, value)
            entry = (
                entry
                or decode_entry(bucket, token, value, revision)
                or SlotEntry(limit=claim.limit, key=claim.key, size=claim.size)
            )
            lines = Lines(kv, bucket, token, entry, revision, read, before)
            if entry.waiting:
                await lines.upgrade()
            results = [await change(lines) for change, _ in batch]
            writes = lines.writes()
            if not writes and used:
                continue  # decided on what this process knew: believed once read afresh
            try:
                await self._write(kv, writes)
            except KeyWrongLastSequenceError:
                for key in [token, *(k for k, _, _ in writes), *used]:
                    known.pop(key, None)
                continue
            except BaseException:  # not known how far it went: read afresh next time
                for key in [token, *(k for k, _, _ in writes)]:
                    known.pop(key, None)
                raise
            self._written.keep(token, writes, entry)
            return results
        raise RuntimeError(f"slots of {claim.limit} ({claim.key!r}): too many conflicting writes")

    async def _write(self, kv: Any, writes: list[tuple[str, bytes | None, int]]) -> None:
        """Write back what a change made (nothing, one key, or several in one batch), and
        keep the revisions written. One key is one compare-and-set (about 50 µs of this
        process's CPU less than the client's ``kv.update``, which decodes its answer as a
        generic one); several, an atomic batch."""
        if len(self._known) > 8192:
            self._known.clear()
        if not writes:
            return
        # A delete is written with its revision known too: the next change of the key (a
        # limit that empties and fills again, as each run or request of a quiet one does)
        # writes over the delete marker without reading it first.
        first = await put_all(kv, writes, gone_kept_s=slotlines.GONE_KEPT_S)
        for i, (key, value, _) in enumerate(writes):
            self._known[key] = (value or b"", first + i)

    async def enter(self, claim: ev.SlotClaim, run_id: str, queued_at: str) -> Entered:
        """Give the run a slot if one is free and nobody waits before it; else (``queue``,
        ``cancel-oldest``) put it in line, or (``skip``) leave it out. Repeats safely."""
        waiter = Waiter(run_id, queued_at, claim.size, claim.priority, claim.fair, claim.weight)

        async def change(lines: Lines) -> Entered:
            entry = lines.entry
            entry.size = claim.size
            if entry.holds(run_id):
                return Entered(held=True)
            place = await lines.find(waiter)
            if place is None:
                if room(entry, waiter) and not entry.lines:
                    admit(entry, waiter, claim.fair)  # its key served last, and counted
                    return Entered(held=True)
                if claim.on_limit == "skip":
                    return Entered(held=False, skipped=True)
                if crowded(entry, claim):
                    return Entered(held=False, place=entry.queued, skipped=True, crowded=True)
                # In line by priority, then the time of its run.queued (then run id),
                # however late the relay of another replica got to it.
                place = await lines.insert(waiter)
            granted = await grant(lines)
            others = tuple(r for r in granted if r != run_id)
            if run_id in granted:
                return Entered(held=True, others=others)
            evict = entry.holders[0].run_id if claim.on_limit == "cancel-oldest" else None
            return Entered(held=False, place=place, evict=evict, others=others)

        entered: Entered = await self.change(claim, change, urgent=self.short(claim))
        return entered

    def short(self, claim: ev.SlotClaim) -> bool:
        """Whether the claim's line, as last written here, has no segment (a run entering
        it writes the entry alone)."""
        entry = self._written.peek(entry_key(claim.limit, claim.key))
        lines = [] if entry is None else [x for x in entry.lines if x.fair == claim.fair]
        return entry is not None and not any(line.segments for line in lines)

    async def take_all(self, claim: ev.SlotClaim) -> list[str]:
        """Take every waiter out of the line (a workflow resumed); the runs taken, first
        first."""

        async def change(lines: Lines) -> list[str]:
            taken = sorted(await lines.take_all(), key=order)
            return [w.run_id for w in taken]

        taken: list[str] = await self.change(claim, change)
        return taken

    async def release(self, claim: ev.SlotClaim, run_id: str) -> list[str]:
        """Take the run out (holding or waiting); the runs given the slots that frees. When
        the run was not there (freed already: this is done again), the holders, whose
        admission may be what was left undone."""
        return await self.release_all([(claim, run_id)])

    async def release_all(self, items: Sequence[tuple[ev.SlotClaim, str]]) -> list[str]:
        """:meth:`release` of each run (with its claim) of one limit and key, in one change
        (:func:`slotturns.let_go_all`)."""

        async def change(lines: Lines) -> list[str]:
            return await let_go_all(lines, items)

        granted: list[str] = await self.change(items[0][0], change, urgent=True)
        return granted


def in_order(slots: Sequence[ev.SlotClaim]) -> list[ev.SlotClaim]:
    """The slots in the order they are taken: a paused workflow's first (a run waiting for
    its workflow holds no slot meanwhile), then by limit name (the same for every run)."""
    return sorted(slots, key=lambda s: (not is_pause(s), s.limit, s.key))


class Admission:
    """Runs into their slots and out of them, as the relay reads their records."""

    def __init__(self, nc: Client, subjects: Subjects, runs: Runs, clock: Callable[[], str]):
        self.slots = Slots(nc, subjects)
        self.pauses = Pauses(nc, subjects)
        self._runs = runs
        self._clock = clock
        self._sweep: asyncio.Task[None] | None = None
        self.background: list[Callable[[], Coroutine[Any, Any, None]]] = []  # atonce's sweep
        self._background: list[asyncio.Task[None]] = []
        self.capability_resumed: Callable[[str], Awaitable[None]] | None = None
        """Told the name of a capability resumed (its requests' lines are not runs')."""

    async def start(self) -> None:
        """Follow the paused workflows; then, in the background, let go the runs of every
        workflow resumed while no orchestrator watched."""
        await self.pauses.start(self.resumed, self.capability_resumed)
        self._sweep = asyncio.create_task(self._resumed_meanwhile())
        self._background = [asyncio.create_task(work()) for work in self.background]

    async def stop(self) -> None:
        await self.pauses.stop()
        for task in filter(None, [self._sweep, *self._background]):
            await cancel_and_wait(task)

    async def _resumed_meanwhile(self) -> None:
        try:
            async for _, entry in self.slots.scan():
                if entry is None or not entry.limit.endswith(PAUSED):
                    continue
                paused = entry.limit.removesuffix(PAUSED)
                if paused.startswith(CAPABILITY_LIMIT):
                    capability = paused.removeprefix(CAPABILITY_LIMIT)
                    resumed = self.capability_resumed
                    if resumed is not None and not self.pauses.holds_capability(capability):
                        await resumed(capability)
                    continue
                namespace, _, name = paused.partition("/")
                if not self.pauses.holds(namespace, name):
                    await self.resumed(namespace, name)
        # Done again at the next start.
        except Exception as exc:  # noqa: BLE001
            log.warning("could not look for runs of resumed workflows: %s", exc)

    async def resumed(self, namespace: str, name: str) -> None:
        """A workflow resumed: the runs that waited for it go on, first first, and those
        paused with it here are resumed."""
        for run_id in await self.slots.take_all(pause_claim(namespace, name)):
            await self._go_on(run_id)
        await self.pauses.resume_here(self._runs, namespace, name, self._clock())

    async def queued(
        self,
        run_id: str,
        slots: Sequence[ev.SlotClaim],
        since: str,
        held: ev.SlotClaim | None = None,
    ) -> None:
        """A run waits for ``slots`` since ``since`` (its ``run.queued``): take what is
        free, admit it once it holds them all. ``held``: a slot it was just given (a
        write that moved it into the holders said so): not asked for again."""
        for claim in in_order(slots):
            if held is not None and (claim.limit, claim.key) == (held.limit, held.key):
                continue
            if is_pause(claim):
                namespace, _, name = claim.limit.removesuffix(PAUSED).partition("/")
                if not self.pauses.holds(namespace, name):
                    continue  # resumed since (or never seen paused here): on to the rest
            entered = await self.slots.enter(claim, run_id, since)
            for other in entered.others:
                await self._go_on(other, claim)
            if entered.skipped:
                what = "the line of" if entered.crowded else "concurrency limit"
                await self._cancel(
                    run_id, f"skipped: {what} {claim.limit} is full for key {claim.key!r}"
                )
                return
            if entered.evict is not None and entered.evict != run_id:
                await self._cancel(
                    entered.evict,
                    f"cancelled to make room under concurrency limit {claim.limit} "
                    f"(key {claim.key!r}) for run {run_id}",
                )
            if not entered.held:
                return  # in line: taken further when a slot frees
        await self._admit(run_id)

    async def ended(self, run_id: str, slots: Sequence[ev.SlotClaim]) -> None:
        """A run that needed ``slots`` ended: its slots (or its places in line) go to the
        next runs in line, which are admitted once they hold all theirs."""
        await self.ended_all([(run_id, slots)])

    async def ended_all(self, ended: Sequence[tuple[str, Sequence[ev.SlotClaim]]]) -> None:
        """As :meth:`ended` for each run, the runs that share a limit and key let go of it
        in one change (one pass over its holders); the entries in the order of their
        limits' names, as each run's are (:func:`in_order`)."""
        by_entry: dict[tuple[str, str], list[tuple[ev.SlotClaim, str]]] = {}
        for run_id, slots in ended:
            for claim in slots:
                by_entry.setdefault((claim.limit, claim.key), []).append((claim, run_id))
        gone = {run_id for run_id, _ in ended}
        for key in sorted(by_entry, key=lambda k: (not is_pause(by_entry[k][0][0]), *k)):
            items = by_entry[key]
            for other in await self.slots.release_all(items):
                if other not in gone:
                    await self._go_on(other, items[0][0])

    async def go_on(self, run_id: str) -> None:
        """A run that may hold all its slots now (resumed): admitted if it does."""
        await self._go_on(run_id)

    async def _go_on(self, run_id: str, held: ev.SlotClaim | None = None) -> None:
        """A run given a slot (``held``, when the write that gave it is known): on to its
        next limits (or admitted); one that ended in the meantime gives its slots back.
        A cached state that says the run waits is taken as is (the admission's append is
        a compare-and-set on the log: a stale one is refused, read again, decided again)."""
        entry = self._runs.cached(run_id)
        if entry is None or not entry.state.queued:
            entry = await self._runs.load(run_id, fresh=True)
        if entry is None or entry.state.slots is None:
            return
        if entry.state.finished:
            await self.ended(run_id, entry.state.slots)
        elif entry.state.queued:
            await self.queued(run_id, entry.state.slots, entry.state.started_at, held)

    async def _admit(self, run_id: str) -> None:
        """Record the run's admission; a run that is no longer queued records nothing, and
        one that has ended meanwhile (its ``run.queued`` read again after a crash, after
        its end freed its slots) gives back the slots it was just given."""
        now = self._clock()
        holding = await self.pauses.holding(self._runs, run_id)
        async with self._runs.locked(run_id):
            try:
                records = await self._runs.apply(
                    run_id, lambda d, s: self.pauses.admitted(d, s, now, holding=holding)
                )
            except (UnknownRun, UnknownWorkflow) as exc:
                log.warning("cannot admit run %s: %s", run_id, exc)
                return
        if records:
            return
        entry = await self._runs.load(run_id, fresh=True)
        if entry is not None and entry.state.finished and entry.state.slots is not None:
            await self.ended(run_id, entry.state.slots)

    async def _cancel(self, run_id: str, reason: str) -> None:
        from interlock.core.engine import cancel  # the engine: not for readers of slots

        now = self._clock()
        async with self._runs.locked(run_id):
            try:
                await self._runs.apply(
                    run_id, lambda d, s: cancel(d, s, reason=reason, now=now), loads=False
                )
            except (UnknownRun, UnknownWorkflow) as exc:
                log.warning("cannot cancel run %s: %s", run_id, exc)
