"""The effects of control-flow records, done by the relay after they are in the log.

- ``timer.scheduled``: the timer is scheduled (durably, see :mod:`timers`); when it is due
  the run decides on an ``io.interlock.timer.fired`` event.
- ``action.requested`` with a ``workflow``: a child run is started (its id derives from
  the action, so a repeat starts nothing); its end is reported back to the parent as the
  action's answer (``task.completed`` with its outputs, or ``task.failed``).
- ``action.cancelled``, a timed-out ``action.failed``, ``run.cancelled``: the agents working
  on those actions are told to stop, and child runs are cancelled.
- ``run.started`` with a correlation key: the run is indexed under it; ``state.entered``
  of such a run: events parked for its key are offered to it again.
- ``run.queued``: the run takes the concurrency slots it needs, or its place in line
  (:mod:`concurrency`); the end of a run that needed slots gives them to the next in line;
  ``run.resumed`` of a run still queued admits it if it holds them (not while paused);
  ``run.migrated`` gives back the slots its new version does not ask for.
- A request of a limited or paused capability, its admission and the records that end it
  are the relay's to take to :mod:`capacity` (they dispatch, or not).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable

from msgspec.structs import replace
from nats.aio.client import Client

from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.engine import TIMER_FIRED, Incoming, cancel
from interlock.core.incoming import SPAWNS_EXTENSION
from interlock.core.state import RunState
from interlock.core.vocabulary import TASK_COMPLETED, ErrorClass
from interlock.core.windowing import is_window_timer
from interlock.runtime.answers import Answers
from interlock.runtime.atonce import AtOnce
from interlock.runtime.capacity import Capacity, is_stop_timer
from interlock.runtime.chains import newest, start_next
from interlock.runtime.concurrency import Admission
from interlock.runtime.correlation import CorrelationIndex
from interlock.runtime.errors import InvalidInputs, UnknownRun, UnknownWorkflow
from interlock.runtime.freeing import FreeAtOnce
from interlock.runtime.notices import CancelNotices
from interlock.runtime.ratetokens import is_rate_timer
from interlock.runtime.registry import Registry
from interlock.runtime.retention import Policy, Retainer, is_retention_timer
from interlock.runtime.routing import correlation_keys
from interlock.runtime.runs import Runs
from interlock.runtime.taskqueue import TaskQueue
from interlock.runtime.timers import Timers
from interlock.transport import tasks
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.flow")

TIMERS_SOURCE = "interlock://timers"

Deliver = Callable[[str, Incoming], Awaitable[bool]]
"""Decide on an event for a run (the orchestrator's ``deliver``); False: no such run."""


def child_run_id(action_id: str, attempt: int) -> str:
    """The child run an action starts: the same action attempt never starts two."""
    return "c" + hashlib.sha256(f"{action_id}#{attempt}".encode()).hexdigest()[:24]


_MAY_ACT = frozenset(
    {
        ev.TimerScheduled,
        ev.ActionRequested,
        ev.ActionCancelled,
        ev.ActionFailed,
        ev.RunCancelled,
        ev.RunStarted,
        ev.StateEntered,
        ev.RunCompleted,
        ev.RunFailed,
        ev.RunQueued,
        ev.RunResumed,
        ev.RunContinued,
        ev.RunMigrated,
    }
)
"""The record types :meth:`ControlFlow.effect` may act on (the others have no effect)."""


_ENDS = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunContinued)  # a log's last


class ControlFlow:
    """Timers, child runs, cancellation notices and correlation for one orchestrator."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        queue: TaskQueue,
        runs: Runs,
        registry: Registry,
        timers: Timers,
        clock: Callable[[], str],
        deliver: Deliver,
        answers: Answers,
        retention: Policy | None = None,
    ) -> None:
        self._js = jetstream(nc)
        self._subjects = subjects
        self._runs = runs
        self._registry = registry
        self._clock = clock
        self._deliver = deliver
        self._answers = answers
        self.notices = CancelNotices(nc, subjects, queue, runs.log)
        self.timers = timers
        self.correlation = CorrelationIndex(nc, subjects)
        self.admission = Admission(nc, subjects, runs, clock)
        self.capacity = Capacity(self.admission.slots, self.admission.pauses, runs, timers, clock)
        self.admission.capability_resumed = self.capacity.resumed
        self.at_once = AtOnce(self.admission, self.capacity, runs, clock)
        runs.at_once = self.at_once
        self.freeing = FreeAtOnce(self.admission, runs, self.capacity)
        """Frees the slots of a run whose end this process appended, once acknowledged."""
        self.retainer = (
            None
            if retention is None
            else Retainer(
                nc,
                subjects,
                log=runs.log,
                registry=registry,
                timers=timers,
                clock=clock,
                policy=retention,
            )
        )
        """Deletes ended runs past their retention (None: none is ever deleted here)."""
        self.window_due: Callable[[str, str], Awaitable[None]] | None = None
        """Closes a debounced or batched trigger's window whose timer fired."""

    def start(self, due: Callable[[str, str], Awaitable[None]] | None = None) -> None:
        self.timers.start(due or self.timer_due)  # (the orchestrator's: see owners)

    async def stop(self) -> None:
        await self.timers.stop()
        await self.freeing.stop()
        await self.admission.stop()

    # -- the relay's side ---------------------------------------------------------------

    def effect(self, record: ev.AnyRecord) -> Awaitable[None] | None:
        """The effect of one appended record, if it has one here."""
        if type(record) not in _MAY_ACT:
            return None
        if isinstance(record, ev.ActionRequested) and not record.data.workflow:
            self.notices.note(record.data.action_id, record.data.capability)
        act = self._act(record)
        return None if act is None else act(record)

    def effect_now(self, record: ev.AnyRecord) -> bool:
        """Do the record's effect if there is none to await (True); False, with nothing
        done, when :meth:`effect` has one."""
        if type(record) not in _MAY_ACT:
            return True
        if self._act(record) is not None:
            return False
        if isinstance(record, ev.ActionRequested) and not record.data.workflow:
            self.notices.note(record.data.action_id, record.data.capability)
        return True

    def _act(self, record: ev.AnyRecord) -> Callable[[ev.AnyRecord], Awaitable[None]] | None:
        handler: Callable[[ev.AnyRecord], Awaitable[None]] | None = None
        if isinstance(record, ev.TimerScheduled):
            handler = self._schedule
        elif isinstance(record, ev.ActionRequested) and record.data.workflow:
            handler = self._start_child
        elif isinstance(record, ev.ActionCancelled):
            handler = self._action_cancelled
        elif (
            isinstance(record, ev.ActionFailed)
            and record.data.error.error_class == ErrorClass.TIMEOUT
        ):
            handler = self._action_timed_out
        elif isinstance(record, ev.RunCancelled):
            handler = self._run_cancelled
        elif isinstance(record, ev.RunStarted) and record.data.correlation_key:
            handler = self._index
        elif isinstance(record, ev.StateEntered) and not self._uncorrelated(record.subject):
            handler = self._offer_parked
        elif isinstance(record, ev.RunQueued):
            handler = self._queued
        elif isinstance(record, ev.RunResumed):
            handler = self._resumed
        elif isinstance(record, ev.RunMigrated) and record.data.freed:
            handler = self._migrated
        if isinstance(record, ev.RunContinued):
            handler = self._go_on
        if isinstance(record, _ENDS):
            orphan = record.data.parent is None or isinstance(record, ev.RunContinued)
            retained = self.retainer is not None and self.retainer.active
            # A run not cached is loaded by _finished, which then sees its slots.
            plain = self._uncorrelated(record.subject) and not self._limited(record.subject)
            if handler is None and orphan and not retained and plain:
                return None  # no parent to tell, nothing to take out of an index or delete
            return functools.partial(self._finished, handler)
        return handler

    def _uncorrelated(self, run_id: str) -> bool:
        """Whether the cached state shows the run keeps no correlation key (its parked
        events and the correlation index have nothing for it); False when not cached."""
        entry = self._runs.cached(run_id)
        return entry is not None and not entry.state.correlation_key

    def _limited(self, run_id: str) -> bool:
        """Whether the cached state shows the run needed concurrency slots (not freed
        here at once already)."""
        entry = self._runs.cached(run_id)
        return (
            entry is not None and entry.state.slots is not None and not self.freeing.settled(run_id)
        )

    async def _go_on(self, record: ev.AnyRecord) -> None:
        """A run continued as new: the run that goes on in its place is started."""
        assert isinstance(record, ev.RunContinued)
        await start_next(self._runs, record, self.admission.pauses.holds)

    async def _queued(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.RunQueued)
        if record.data.rate is not None:
            return  # its rate's timer queues it again, for its slots, when its time comes
        await self.admission.queued(record.subject, record.data.slots, record.time)

    async def _migrated(self, record: ev.AnyRecord) -> None:
        """A run moved onto a version that does not ask for some of its slots: they go
        to the next in line; a run still waiting is admitted if it holds the rest."""
        assert isinstance(record, ev.RunMigrated)
        await self.admission.ended(record.subject, record.data.freed)
        await self.admission.go_on(record.subject)

    async def _resumed(self, record: ev.AnyRecord) -> None:
        """A run resumed: if it waits for its slots, it is admitted once it holds them (it
        was not while paused)."""
        entry = self._runs.cached(record.subject)
        if entry is not None and entry.state.slots is None:
            return  # no limit: nothing to admit
        await self.admission.go_on(record.subject)

    async def _finished(
        self, handler: Callable[[ev.AnyRecord], Awaitable[None]] | None, record: ev.AnyRecord
    ) -> None:
        """A run ended: its own effect, its parent told, out of the correlation index, and
        its deletion scheduled where it is kept for a limited time."""
        assert isinstance(record, _ENDS)
        if handler is not None:
            await handler(record)
        if record.data.parent is not None and not isinstance(record, ev.RunContinued):
            await self._answer_parent(record)
        entry = self._runs.cached(record.subject) or await self._runs.load(record.subject)
        slots = None if entry is None else entry.state.slots
        if slots is not None and not await self.freeing.freed(record.subject):
            await self.admission.ended(record.subject, slots)
        if entry is not None and entry.state.correlation_key:
            s = entry.state
            await self.correlation.remove(
                s.namespace, s.workflow, s.correlation_key or "", record.subject
            )
        if entry is not None and self.retainer is not None and self.retainer.active:
            await self.retainer.ended(record.subject, record.time, entry.state)

    async def _schedule(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.TimerScheduled)
        await self.timers.schedule(record.subject, record.data.timer_id, record.data.fire_at)

    async def timer_due(self, run_id: str, timer_id: str) -> None:
        if is_window_timer(timer_id):
            if self.window_due is not None:
                await self.window_due(run_id, timer_id)
            return
        if is_rate_timer(run_id, timer_id):
            await self.capacity.wake(run_id)
            return
        if is_stop_timer(run_id, timer_id):
            await self.capacity.stop_due(run_id, timer_id)
            return
        if is_retention_timer(run_id, timer_id):
            if self.retainer is not None:
                await self.retainer.due(run_id)
            return
        if self.known_stale(run_id, timer_id):
            return
        event = Incoming(
            type=TIMER_FIRED,
            source=TIMERS_SOURCE,
            id=timer_id,
            time=self._clock(),
            extensions={"timerid": timer_id},
        )
        await self._deliver(run_id, event)

    def known_stale(self, run_id: str, timer_id: str) -> bool:
        """Whether the cached state proves the timer is gone (taken, or its state left).

        Most timers are action deadlines that the answer beat; deciding on them would read
        the run's log only to find nothing to do. The cache proves it only when it has seen
        the record that set the timer (ids are ``<run>:<log position>``): a cache behind the
        log (another replica appended since) proves nothing, and the run decides as usual.
        """
        entry = self._runs.cached(run_id)
        if entry is None:
            return False
        _, _, position = timer_id.rpartition(":")
        if not position.isdigit() or int(position) > entry.state.seq:
            return False
        return entry.state.finished or timer_id not in entry.state.timers

    # -- cancellation ---------------------------------------------------------------------

    async def _tell(
        self, record: ev.AnyRecord, actions: list[str], attempt: int | None = None
    ) -> None:
        """Publish a cancel notice for ``actions`` of the record's run (about one attempt,
        or all of each); a request no agent has taken yet leaves the queue, and the slots
        a worker would have stopped in go now (nobody stops it)."""
        from interlock.core.capacity import freed_by  # the engine: not for readers

        never = await self.notices.tell(record.subject, actions, record.time, attempt)
        for slots in freed_by(record):
            if slots.stopping_until and (slots.action_id, slots.attempt) in never:
                await self.capacity.stopped(record.subject, slots)

    async def _action_cancelled(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.ActionCancelled)
        if record.data.workflow:
            await self._cancel_children(record.data.action_id, record.data.reason)
        else:
            await self._tell(record, [record.data.action_id])

    async def _action_timed_out(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.ActionFailed)
        # Names the attempt: the retry that follows keeps the action id and must run.
        await self._tell(record, [record.data.action_id], record.data.attempt)
        await self._cancel_children(record.data.action_id, "timed out", record.data.attempt)

    async def _run_cancelled(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.RunCancelled)
        await self._tell(record, record.data.cancelled_actions)
        for action_id in record.data.cancelled_actions:
            await self._cancel_children(action_id, "parent cancelled")

    async def _cancel_children(self, action_id: str, reason: str, attempt: int = 0) -> None:
        """Cancel the child run of one attempt of the action, or (0) of every attempt:
        ``retry.max_attempts`` has no upper bound, so they are tried until one has none."""
        attempts: Iterable[int] = [attempt] if attempt else itertools.count(1)
        for n in attempts:
            child = await newest(self._runs, child_run_id(action_id, n))
            now = self._clock()

            def decision(definition: Definition, state: RunState) -> list[ev.AnyRecord]:
                return cancel(definition, state, reason=reason, now=now)  # noqa: B023

            try:
                await self._runs.apply(child, decision, loads=False)
            except UnknownRun:
                if not attempt:
                    return  # attempts are numbered from 1: no child n, no child n + 1
            except UnknownWorkflow as exc:
                log.warning("cannot cancel child run %s: %s", child, exc)

    # -- child runs -----------------------------------------------------------------------

    async def _start_child(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.ActionRequested)
        d = record.data
        assert d.workflow is not None
        # An unqualified name is looked up in the parent's namespace; ``ns/name`` names another.
        parent_run = await self._runs.load(record.subject)
        namespace = parent_run.state.namespace if parent_run is not None else "default"
        try:
            definition, version = await self._registry.latest(d.workflow, namespace)
        except UnknownWorkflow as exc:
            await self._answers.failed(record, ErrorClass.PLATFORM_ERROR, str(exc))
            return
        inputs = d.input if isinstance(d.input, dict) else {}
        parent = ev.ParentRef(run_id=record.subject, action_id=d.action_id, attempt=d.attempt)
        try:
            await self._runs.start(
                definition,
                version,
                child_run_id(d.action_id, d.attempt),
                inputs,
                traceparent=record.traceparent,
                parent=parent,
                spawn=d.spawn,
                paused=self.admission.pauses.holds(definition.namespace, definition.name),
            )
        except InvalidInputs as exc:
            await self._answers.failed(record, ErrorClass.SCHEMA_ERROR, str(exc))

    async def _answer_parent(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled)
        parent = record.data.parent
        assert parent is not None
        if isinstance(record, ev.RunCompleted):
            event_type, data = TASK_COMPLETED, dict(record.data.outputs)
        elif isinstance(record, ev.RunFailed):
            error = record.data.error
            event_type, data = tasks.failure(error.error_class, error.message, code=error.code)
        else:
            event_type, data = tasks.failure(ErrorClass.CANCELLED, record.data.reason)
        event = tasks.answer_event(
            run_id=parent.run_id,
            action_id=parent.action_id,
            attempt=parent.attempt,
            event_id=f"{record.subject}.end",
            source=f"interlock://runs/{record.subject}",
            type=event_type,
            data=data,
            time=record.time,
        )
        if record.data.spawns is not None:  # what the child spent of its spawn allowance
            spawns = {SPAWNS_EXTENSION: str(record.data.spawns)}
            event = replace(event, extensions={**event.extensions, **spawns})
        # The parent's action is a child-workflow call, answered under that capability.
        await self._answers.publish("", event)

    # -- correlation ----------------------------------------------------------------------

    async def _index(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.RunStarted)
        d = record.data
        assert d.correlation_key is not None
        await self.correlation.add(d.namespace, d.workflow, d.correlation_key, record.subject)

    async def _offer_parked(self, record: ev.AnyRecord) -> None:
        entry = self._runs.cached(record.subject)
        state = entry.state if entry is not None else None
        if state is None:
            loaded = await self._runs.load(record.subject)
            state = None if loaded is None else loaded.state
        if state is None or not state.correlation_key or state.finished:
            return
        parked = await self.correlation.parked(
            state.namespace, state.workflow, state.correlation_key
        )
        for event in parked:
            await self._deliver(record.subject, to_incoming(event))

    async def route_correlated(
        self, event: CloudEvent, incoming: Incoming, lane: str = ""
    ) -> tuple[bool, list[str]]:
        """Deliver an event to the runs its correlation key names; park it when none takes
        it. ``incoming``: the event with its data loaded when it came by reference (the
        keys read the data; ``event``, as it came, is what is parked). Gives whether some
        workflow correlates events of its type, and why the keys that could not be
        computed were refused (their expression ran out of budget)."""
        correlated = False
        refused: list[str] = []
        keys = await correlation_keys(
            list(self._registry.correlating(event.type)), incoming, self._runs, lane
        )
        for found in keys:
            definition, key = found.definition, found.key
            if found.error is not None:
                refused.append(found.error)
            if key is None:
                continue
            correlated = True
            runs = await self.correlation.runs(definition.namespace, definition.name, key)
            taken = False
            for run_id in runs:
                taken = await self._deliver(run_id, incoming) or taken
            if taken:
                continue
            await self.correlation.park(definition.namespace, definition.name, key, event)
            # A run may have started waiting between "not taken" and "parked": it looked
            # for parked events before this one was there. Offer it once more.
            for run_id in await self.correlation.runs(definition.namespace, definition.name, key):
                await self._deliver(run_id, incoming)
        return correlated, refused


def to_incoming(event: CloudEvent) -> Incoming:
    """The engine's view of an inbound CloudEvent."""
    return Incoming(
        type=event.type,
        source=event.source,
        id=event.id,
        data=event.data,
        time=event.time,
        subject=event.subject,
        extensions=dict(event.extensions),
    )
