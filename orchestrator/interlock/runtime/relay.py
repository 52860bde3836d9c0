"""The relay (the outbox): every appended run-log record read back and acted on.

The relay reads the RUNS stream with a durable pull consumer: action requests are
published to capability subjects (:mod:`dispatch`, unless dispatched already as their
append was acknowledged), cancellations are told to agents, timers, child runs and the
correlation index are seen to (:mod:`flow`), and the run index is written behind the runs
(:mod:`writebehind`: once for a short run, with the deadlines the answers beat never
scheduled). Effects follow the log, never precede it, so a crash anywhere re-does them
without duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime
from typing import Any

from nats.aio.msg import Msg

from interlock.core import events as ev
from interlock.core.analysis import acted_on
from interlock.core.capacity import freed_by
from interlock.core.engine import plus_seconds
from interlock.core.rfc3339 import parse_time
from interlock.runtime.answering import AnswerRouting
from interlock.runtime.atonce import admitted_later, at_once
from interlock.runtime.dispatch import Dispatcher
from interlock.runtime.flow import ControlFlow
from interlock.runtime.handling import MessageHandling
from interlock.runtime.inturn import Acting, Batch
from interlock.runtime.layouts import Housekeeping
from interlock.runtime.logstore import RunLog, check_message
from interlock.runtime.observe import Observers
from interlock.runtime.ownership import ROUND_S, Ownership, redeliver_now, replica_name
from interlock.runtime.runindex import INDEXED, RunIndex
from interlock.runtime.runs import Runs
from interlock.runtime.timers import JetStreamTimers
from interlock.runtime.writebehind import WriteBehind
from interlock.transport.natsclient import ack_nowait
from interlock.transport.pulling import deliveries, stream_sequence
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")

Effects = tuple[list[ev.AnyRecord], list[ev.TimerScheduled]]
"""The records of a run acted on, and the timers left to the write-behind."""

SHORT_CHECK_S = 0.25
"""How soon the next round comes while this replica holds less than its fair share."""
MAP_CHECK_S = ROUND_S
"""How often the relay reads the partition map again, and renews, takes or lets go of
partition leases."""
DISPATCH_CHECK_AGE_S = 60.0
"""An action request read later than this after it was appended is checked against the
run's log before it is published: the capability stream's dedupe window is two minutes."""


class Relay:
    """The orchestrator's relay loop over the run logs, with its write-behind index."""

    def __init__(
        self,
        subjects: Subjects,
        *,
        clock: Callable[[], str],
        handling: MessageHandling,
        runs: Runs,
        run_log: RunLog,
        flow: ControlFlow,
        dispatcher: Dispatcher,
        index: RunIndex,
        observers: Observers,
        index_hold: float,
        route_answers: Callable[[AnswerRouting | None], Awaitable[None]] | None = None,
    ) -> None:
        """``route_answers``: told, when the installation gets more than one partition
        (or goes back to one), which runs' answers this replica takes (None: any)."""
        self.subjects, self.clock, self.handling = subjects, clock, handling
        self.runs, self.run_log, self.flow = runs, run_log, flow
        self.dispatcher, self.observers = dispatcher, observers
        self.behind = self._write_behind(index, index_hold)
        self.route_answers = route_answers
        self.ownership = Ownership(handling.nc, subjects, replica_name())
        """This replica's partition leases (with more than one partition)."""
        self.hold: Callable[[Collection[int]], Awaitable[None]] | None = None
        """Told each round which partitions' handed-over messages to take (:mod:`owners`)."""
        self._tidy = Housekeeping()
        self._routing = AnswerRouting(run_log.placement, lambda: self.ownership.held)

    def _write_behind(self, index: RunIndex, hold: float) -> WriteBehind:
        """The relay's write-behind of the run index (see :mod:`writebehind`)."""
        return WriteBehind(
            index,
            self.observers.relayed,
            # Timers scheduled by a stream write wait for the flush; in-memory ones, at once.
            schedule=(
                self._schedule_timer if isinstance(self.flow.timers, JetStreamTimers) else None
            ),
            stale=self.flow.known_stale,
            hold=hold,
        )

    async def run(self) -> None:
        """Read the run logs and act on them until the orchestrator stops: every
        partition's with one partition, else those this replica holds the lease of
        (:mod:`ownership`), a partition added to the map meanwhile from when it is seen."""
        stopping = self.handling.stopping
        placement = self.run_log.placement
        relaying: dict[int, asyncio.Task[None]] = {}
        routed = False
        log.info("replica name (the owner of its partition leases): %s", self.ownership.me)
        try:
            while not stopping.is_set():
                with contextlib.suppress(Exception):  # the map read again next time
                    await placement.load()
                wanted = await self._wanted(placement.map.relayed, set(relaying))
                partitioned = placement.map.relayed > 1
                self._housekeeping()
                if self.route_answers is not None and partitioned != routed:
                    try:
                        await self.route_answers(self._routing if partitioned else None)
                        routed = partitioned
                    # Tried again next round; meanwhile agents answer the other way.
                    except Exception as exc:  # noqa: BLE001
                        log.warning("cannot subscribe to answers: %s", exc)
                if self.hold is not None:
                    try:
                        await self.hold(wanted if partitioned else ())
                    # Tried again next round; meanwhile the readers decide them.
                    except Exception as exc:  # noqa: BLE001
                        log.warning("cannot take messages handed over: %s", exc)
                for partition in set(relaying) - wanted:
                    relaying.pop(partition).cancel()
                    log.info("partition %d: relayed by another replica now", partition)
                for partition in sorted(wanted):
                    task = relaying.get(partition)
                    if task is None or task.done():
                        taken = partition in self.ownership.taken
                        relaying[partition] = asyncio.create_task(self.relay(partition, taken))
                wait = SHORT_CHECK_S if self.ownership.short else MAP_CHECK_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), wait)
        finally:
            self._tidy.stop()
            for task in relaying.values():
                task.cancel()
            await asyncio.gather(*relaying.values(), return_exceptions=True)
            if self.ownership.held:
                with contextlib.suppress(Exception):
                    await self.ownership.release_all()

    def _housekeeping(self) -> None:
        """Retire the partition layouts no run needs (:mod:`layouts`), now and then, in the
        background: by the holder of partition 0, or by every replica when none is held."""
        map_, held = self.run_log.placement.map, self.ownership.held
        if map_.single or (held and 0 not in held) or not self._tidy.due():
            return
        self._tidy.start(self.handling.nc, self.subjects)

    async def _wanted(self, streams: int, now: set[int]) -> set[int]:
        """The partitions to relay: all of one; else those held (what is relayed now
        when the leases cannot be read or written this round)."""
        if streams == 1 and not self.ownership.held:
            return {0}
        try:
            return await self.ownership.round(streams)
        # Leases expire on their own: the next round takes or lets go.
        except Exception as exc:  # noqa: BLE001
            log.warning("partition leases: %s", exc)
            return now

    async def relay(self, partition: int, taken: bool = False) -> None:
        """Read one partition's run logs and act on them until the orchestrator stops;
        ``taken`` from another replica: what it had in hand handed out again at once."""
        s = self.subjects
        stream = s.runs_stream_of(partition)
        # Partition 0's consumer keeps the filter of the one stream before partitions.
        subject = s.runs_all if partition == 0 else s.runs_of(partition)
        acting = Acting()  # several batches at once, each run's records in turn
        try:
            if taken:
                await redeliver_now(self.handling.nc, stream)
            reader = await self.handling.reader(stream, subject, "relay", 512, 20_000)
            async with contextlib.aclosing(reader.batches(self.handling.stopping)) as batches:
                async for msgs in batches:
                    if not self.run_log.placement.map.single:
                        # Runs placed by an older layout: known to be here from now on.
                        for msg in msgs:
                            run_id = s.run_id_of(msg.subject)
                            self.run_log.placement.seen(run_id, partition)
                    runs = (s.run_id_of(msg.subject) for msg in msgs)
                    await acting.act(runs, functools.partial(self._relay_batch, msgs, stream))
        except asyncio.CancelledError:
            raise
        # Started again at the next look at the map.
        except Exception as exc:  # noqa: BLE001
            log.warning("relay of %s stopped, starting again: %s", stream, exc)
        finally:
            await acting.stop()

    async def _relay_batch(self, msgs: list[Msg], stream: str, turn: Batch) -> None:
        """Act on one batch of run-log messages: effects per run, then ack and report.
        ``turn``: the runs whose records an earlier batch still acts on (waited for)."""
        by_run: dict[str, list[ev.AnyRecord]] = {}
        msgs_of: dict[str, list[Msg]] = {}
        # Runs whose requests are checked against their log (redelivered, or old), and
        # runs with records read from the stream (their requests' times say if old).
        again: set[str] = set()
        dated: set[str] = set()
        oldest = time.monotonic() - DISPATCH_CHECK_AGE_S
        key = await self.run_log.key()
        for msg in msgs:
            try:
                # Appended by this process: its records are at hand, no need to decode,
                # and the time of the append says whether they are old.
                seq = stream_sequence(msg)
                held = self.runs.appended(self.subjects.run_id_of(msg.subject), seq)
                if held is None:
                    found = check_message(key, stream, msg.subject, seq, msg.headers, msg.data)
                    if found is not None:
                        self.run_log.foreign.saw(found)
                        batch = []  # not a record: acked below, never acted on
                    else:
                        batch = ev.decode_batch(msg.data)
                    if batch:
                        dated.add(batch[0].subject)
                else:
                    batch = held[0]
                    if batch and held[1] < oldest:
                        again.add(batch[0].subject)
            # A consumer loop outlives any one message.
            except Exception as exc:  # noqa: BLE001
                # The reason is the message: no traceback.
                log.error("relay: undecodable run-log message on %s: %s", msg.subject, exc)  # noqa: TRY400
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    await msg.ack()
                continue
            if not batch:
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    await msg.ack()
                continue
            run_id = batch[0].subject
            by_run.setdefault(run_id, []).extend(batch)
            msgs_of.setdefault(run_id, []).append(msg)
            if deliveries(msg) > 1:
                again.add(run_id)
                self.observers.redelivered("relay")
        runs = list(by_run)
        outcomes = await self._runs_effects(runs, by_run, msgs, turn, again=again, dated=dated)
        for run_id, outcome in zip(runs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("relay: effects of run %s failed, will redo: %s", run_id, outcome)
                for msg in msgs_of[run_id]:
                    # Best effort: a message left unsettled comes again after its ack wait.
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=1)
                continue
            acted, timers = outcome
            if self.behind.holds(run_id) or timers or any(isinstance(r, INDEXED) for r in acted):
                # Acknowledged once the run's index entry is written (write-behind).
                self.behind.add(run_id, acted, by_run[run_id], msgs_of[run_id], timers)
                continue
            try:
                for msg in msgs_of[run_id]:
                    if not ack_nowait(msg):
                        await msg.ack()
            # It comes again, and is reported then.
            except Exception as exc:  # noqa: BLE001
                log.warning("relay: cannot acknowledge run %s: %s", run_id, exc)
                continue
            # Reported once done and acknowledged: a run whose effects failed here is
            # redone (and reported) by whichever replica gets it next, not twice.
            self.observers.relayed(run_id, by_run[run_id])

    async def _runs_effects(
        self,
        runs: list[str],
        by_run: dict[str, list[ev.AnyRecord]],
        msgs: list[Msg],
        turn: Batch,
        *,
        again: set[str],
        dated: set[str],
    ) -> list[Effects | BaseException]:
        """The effects of each run's records (or why they failed), in the order of ``runs``."""
        # A run's effects are done in log order; different runs go in parallel. Most
        # need nothing awaited (their actions dispatched already): done here, no task.
        # A run an earlier batch still acts on waits for it (not done here).
        held = again | {r for r in runs if turn.waits(r)}
        first = [
            self._effects_now(r, by_run[r], redelivered=r in held, dated=r in dated) for r in runs
        ]
        # Those whose requests' acknowledgements are on their way wait for them together.
        acks = {o for o in first if isinstance(o, asyncio.Future)}
        if acks:
            await asyncio.wait(acks)
        outcomes: list[Effects | BaseException | None] = []
        for run_id, now in zip(runs, first, strict=True):
            if isinstance(now, asyncio.Future):  # (only for runs neither redelivered nor dated)
                now = self._effects_now(run_id, by_run[run_id], dated=False)
            outcomes.append(None if isinstance(now, asyncio.Future) else now)
        later = [i for i, outcome in enumerate(outcomes) if outcome is None]
        if later:
            async with self.handling.working(msgs):
                awaited = await asyncio.gather(
                    *(
                        turn.in_turn(
                            r, self._effects, r, by_run[r], redelivered=r in again, dated=r in dated
                        )
                        for r in (runs[i] for i in later)
                    ),
                    return_exceptions=True,
                )
            for i, result in zip(later, awaited, strict=True):
                outcomes[i] = result
        return [outcome for outcome in outcomes if outcome is not None]

    def _effects_now(
        self,
        run_id: str,
        records: list[ev.AnyRecord],
        *,
        redelivered: bool = False,
        dated: bool = True,
    ) -> Effects | asyncio.Future[Any] | None:
        """What :meth:`_effects` does, when none of it needs awaiting: records appended
        here lately whose action requests were dispatched and acknowledged already, and
        no other effect but timers left to the write-behind. When it returns None (some
        of it needs awaiting) or a future (the acknowledgement of an early dispatch, or
        the free at once of the slots of the run they end, still on its way: to wait for,
        before asking again), nothing is done that may not be done again."""
        if redelivered or dated:
            return None
        frees = self.flow.freeing.requests
        freeing = self.flow.freeing.in_flight(run_id, records) or frees.in_flight(run_id, records)
        if freeing is not None:
            return freeing  # its slots freed here: then nothing of it is left to await
        records = acted_on(records)
        now: datetime | None = None
        deferred: list[ev.TimerScheduled] = []
        dispatched: list[tuple[str, int]] = []
        run_admitted = admitted_later(records)
        for record in records:
            if type(record) is ev.RunQueued and run_admitted:
                continue  # its slots were taken before its append (atonce)
            if self.flow.capacity.awaited(record, frees.unsettled(run_id, freed_by(record))):
                return None
            if isinstance(record, ev.ActionRequested) and not record.data.workflow:
                key = (record.data.action_id, record.data.attempt)
                early = self.dispatcher.early.get(key)
                if early is None:
                    return None
                if not early.done():
                    return early
                if not self.dispatcher.acknowledged(early):
                    return None
                dispatched.append(key)
            elif isinstance(record, ev.TimerScheduled):
                now = now or parse_time(self.clock())
                if not self.behind.defers(record, now):
                    return None
                deferred.append(record)  # scheduled at the flush, if still needed
                continue
            # What it did so far (noting an action's capability) bears doing again.
            if not self.flow.effect_now(record):
                return None
        for key in dispatched:
            del self.dispatcher.early[key]
        for record in records:
            if freed := freed_by(record):
                self.flow.capacity.forget_ended(record.subject, freed)
        return records, deferred

    async def _effects(
        self,
        run_id: str,
        records: list[ev.AnyRecord],
        *,
        redelivered: bool = False,
        dated: bool = True,
    ) -> Effects:
        """Do the effects of a run's records, in log order: the records acted on, and the
        timers left to the write-behind. ``redelivered``: the run's pending actions are
        read from its log first; ``dated``: so too if a request's time is old (False: the
        records were appended here lately)."""
        records = acted_on(records)  # a fork's copied history is not acted on again
        stale = redelivered or (
            dated
            and any(
                isinstance(r, ev.ActionRequested | ev.ActionAdmitted)
                and self._older_than(r.time, DISPATCH_CHECK_AGE_S)
                for r in records
            )
        )
        awaited = await self._still_awaited(run_id) if stale else None
        deferred: list[ev.TimerScheduled] = []
        now: datetime | None = None
        capacity = self.flow.capacity
        admitted, run_admitted = at_once(records), admitted_later(records)
        for record in records:
            if type(record) is ev.RunQueued and run_admitted:
                continue  # its slots were taken before its append (atonce)
            if isinstance(record, ev.ActionRequested) and not record.data.workflow:
                d = record.data
                if awaited is not None and awaited.get(d.action_id) != d.attempt:
                    # Redelivered after a crash (or read late), and the run no longer waits
                    # for this attempt: it was dispatched and answered before. Publishing it
                    # again once the dedupe window has passed would do the work twice.
                    self.dispatcher.early.pop((d.action_id, d.attempt), None)
                    continue
                if _key(record) in admitted:
                    capacity.remember(record)  # out on its admission, next
                elif capacity.holds(record):
                    await capacity.requested(record)  # in line: out on its admission
                else:
                    await self._dispatch(record)
            elif isinstance(record, ev.ActionAdmitted):
                await self._admitted(record, awaited)
            elif isinstance(record, ev.TimerScheduled):
                now = now or parse_time(self.clock())
                if self.behind.defers(record, now):
                    deferred.append(record)  # scheduled at the flush, if still needed
                    continue
            # (what was freed at once here: not again, :mod:`capfreeing`)
            if freed := await self.flow.freeing.requests.left(run_id, freed_by(record)):
                await capacity.freed(record.subject, freed)
            effect = self.flow.effect(record)
            if effect is not None:
                await effect
        return records, deferred

    async def _dispatch(self, record: ev.ActionRequested) -> None:
        """Publish a task request, unless it went out as its append was acknowledged."""
        d = record.data
        early = self.dispatcher.early.pop((d.action_id, d.attempt), None)
        if early is None or not await self.dispatcher.early_done(early, record):
            await self.dispatcher.dispatch(record)

    async def _admitted(self, record: ev.ActionAdmitted, awaited: dict[str, int] | None) -> None:
        """A held request admitted: dispatched (its deadline the admission's), and the
        token it held let go."""
        capacity = self.flow.capacity
        d = record.data
        request = await capacity.request_of(record)
        if request is None:
            log.warning(
                "relay: no request for the admission of %s in %s", d.action_id, record.subject
            )
            return
        if awaited is not None and awaited.get(d.action_id) != d.attempt:
            self.dispatcher.early.pop((d.action_id, d.attempt), None)  # answered before
        else:
            await self._dispatch(request)
        await capacity.admitted(record, request)

    async def _schedule_timer(self, record: ev.TimerScheduled) -> None:
        await self.flow.timers.schedule(record.subject, record.data.timer_id, record.data.fire_at)

    def _older_than(self, time: str, seconds: float) -> bool:
        try:
            return plus_seconds(time, seconds) < self.clock()
        except ValueError:
            return False

    async def _still_awaited(self, run_id: str) -> dict[str, int] | None:
        """The action attempts the run is waiting for, read from its log (None: unknown)."""
        try:
            entry = await self.runs.load(run_id, fresh=True)
        # Dispatch without the check rather than stall.
        except Exception as exc:  # noqa: BLE001
            log.warning("relay: cannot read run %s to check its actions: %s", run_id, exc)
            return None
        if entry is None:
            return None
        return {p.action_id: p.attempt for p in entry.state.pending.values()}


def _key(record: ev.ActionRequested) -> tuple[str, int]:
    return record.data.action_id, record.data.attempt
