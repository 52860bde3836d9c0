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
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.engine import (
    TIMER_FIRED,
    Incoming,
    cancel,
    event_correlation_key,
)
from interlock.core.state import RunState
from interlock.runtime.cloudevents_nats import CloudEvent, encode_binary
from interlock.runtime.correlation import CorrelationIndex
from interlock.runtime.registry import UnknownWorkflow
from interlock.runtime.runs import InvalidInputs, UnknownRun

if TYPE_CHECKING:
    from interlock.runtime.service import Orchestrator
    from interlock.runtime.timers import ClockTimers, JetStreamTimers

log = logging.getLogger("interlock.flow")

TIMERS_SOURCE = "interlock://timers"


def child_run_id(action_id: str, attempt: int) -> str:
    """The child run an action starts: the same action attempt never starts two."""
    return "c" + hashlib.sha256(f"{action_id}#{attempt}".encode()).hexdigest()[:24]


class ControlFlow:
    """Timers, child runs, cancellation notices and correlation for one orchestrator."""

    def __init__(self, orchestrator: Orchestrator, timers: JetStreamTimers | ClockTimers) -> None:
        self.o = orchestrator
        self.timers = timers
        self.correlation = CorrelationIndex(orchestrator.nc, orchestrator.subjects)

    def start(self) -> None:
        self.timers.start(self.timer_due)

    async def stop(self) -> None:
        await self.timers.stop()

    # -- the relay's side ---------------------------------------------------------------

    def effect(self, record: ev.AnyRecord) -> Awaitable[None] | None:
        """The effect of one appended record, if it has one here."""
        handler: Callable[[ev.AnyRecord], Awaitable[None]] | None = None
        if isinstance(record, ev.TimerScheduled):
            handler = self._schedule
        elif isinstance(record, ev.ActionRequested) and record.data.workflow:
            handler = self._start_child
        elif isinstance(record, ev.ActionCancelled):
            handler = self._action_cancelled
        elif isinstance(record, ev.ActionFailed) and record.data.error.error_class == "timeout":
            handler = self._action_timed_out
        elif isinstance(record, ev.RunCancelled):
            handler = self._run_cancelled
        elif isinstance(record, ev.RunStarted) and record.data.correlation_key:
            handler = self._index
        elif isinstance(record, ev.StateEntered):
            handler = self._offer_parked
        if isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
            return self._finished(handler, record)
        return None if handler is None else handler(record)

    async def _finished(
        self, handler: Callable[[ev.AnyRecord], Awaitable[None]] | None, record: ev.AnyRecord
    ) -> None:
        """A run ended: its own effect, its parent told, and out of the correlation index."""
        assert isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled)
        if handler is not None:
            await handler(record)
        if record.data.parent is not None:
            await self._answer_parent(record)
        entry = self.o.runs.cached(record.subject) or await self.o.runs.load(record.subject)
        if entry is not None and entry.state.correlation_key:
            s = entry.state
            await self.correlation.remove(
                s.namespace, s.workflow, s.correlation_key or "", record.subject
            )

    async def _schedule(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.TimerScheduled)
        await self.timers.schedule(record.subject, record.data.timer_id, record.data.fire_at)

    async def timer_due(self, run_id: str, timer_id: str) -> None:
        if self._known_stale(run_id, timer_id):
            return
        event = Incoming(
            type=TIMER_FIRED,
            source=TIMERS_SOURCE,
            id=timer_id,
            time=self.o.clock(),
            extensions={"timerid": timer_id},
        )
        await self.o.deliver(run_id, event)

    def _known_stale(self, run_id: str, timer_id: str) -> bool:
        """Whether the cached state proves the timer is gone (taken, or its state left).

        Most timers are action deadlines that the answer beat; deciding on them would read
        the run's log only to find nothing to do. The cache proves it only when it has seen
        the record that set the timer (ids are ``<run>:<log position>``): a cache behind the
        log (another replica appended since) proves nothing, and the run decides as usual.
        """
        entry = self.o.runs.cached(run_id)
        if entry is None:
            return False
        _, _, position = timer_id.rpartition(":")
        if not position.isdigit() or int(position) > entry.state.seq:
            return False
        return entry.state.finished or timer_id not in entry.state.timers

    # -- cancellation ---------------------------------------------------------------------

    async def tell_agent(
        self, run_id: str, action_id: str, time: str, attempt: int | None = None
    ) -> None:
        """Publish a cancel notice: about one attempt of the action, or (None) all of it."""
        extensions = {"runid": run_id, "actionid": action_id}
        if attempt is not None:
            extensions["attempt"] = str(attempt)
        event = CloudEvent(
            id=f"{action_id}.cancel" if attempt is None else f"{action_id}.{attempt}.cancel",
            source=ev.SOURCE,
            type="io.interlock.task.cancel",
            subject=run_id,
            time=time,
            extensions=extensions,
        )
        headers, payload = encode_binary(event)
        await self.o.nc.publish(self.o.subjects.control(run_id), payload, headers=headers)

    async def _action_cancelled(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.ActionCancelled)
        if record.data.workflow:
            await self._cancel_children(record.data.action_id, record.data.reason)
        else:
            await self.tell_agent(record.subject, record.data.action_id, record.time)

    async def _action_timed_out(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.ActionFailed)
        # Names the attempt: the retry that follows keeps the action id and must run.
        await self.tell_agent(
            record.subject, record.data.action_id, record.time, record.data.attempt
        )
        await self._cancel_children(record.data.action_id, "timed out", record.data.attempt)

    async def _run_cancelled(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.RunCancelled)
        for action_id in record.data.cancelled_actions:
            await self.tell_agent(record.subject, action_id, record.time)
            await self._cancel_children(action_id, "parent cancelled")

    async def _cancel_children(self, action_id: str, reason: str, attempt: int = 0) -> None:
        attempts = [attempt] if attempt else range(1, 11)
        for n in attempts:
            child = child_run_id(action_id, n)
            now = self.o.clock()

            def decision(definition: Definition, state: RunState) -> list[ev.AnyRecord]:
                return cancel(definition, state, reason=reason, now=now)  # noqa: B023

            try:
                await self.o.runs.apply(child, decision)
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
        try:
            definition, version = await self.o.registry.latest(d.workflow)
        except UnknownWorkflow as exc:
            await self.o.answer_failed(record, "platform_error", str(exc))
            return
        inputs = d.input if isinstance(d.input, dict) else {}
        parent = ev.ParentRef(run_id=record.subject, action_id=d.action_id, attempt=d.attempt)
        try:
            await self.o.runs.start(
                definition,
                version,
                child_run_id(d.action_id, d.attempt),
                inputs,
                traceparent=record.traceparent,
                parent=parent,
            )
        except InvalidInputs as exc:
            await self.o.answer_failed(record, "schema_error", str(exc))

    async def _answer_parent(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled)
        parent = record.data.parent
        assert parent is not None
        if isinstance(record, ev.RunCompleted):
            event_type, data = "task.completed", dict(record.data.outputs)
        elif isinstance(record, ev.RunFailed):
            error = record.data.error
            event_type = "task.failed"
            data = {"error": {"class": error.error_class, "message": error.message}}
        else:
            event_type = "task.failed"
            data = {"error": {"class": "cancelled", "message": record.data.reason}}
        event = CloudEvent(
            id=f"{record.subject}.end",
            source=f"interlock://runs/{record.subject}",
            type=event_type,
            subject=parent.run_id,
            time=record.time,
            datacontenttype="application/json",
            data=data,
            extensions={
                "runid": parent.run_id,
                "actionid": parent.action_id,
                "attempt": str(parent.attempt),
            },
        )
        headers, payload = encode_binary(event)
        headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
        await self.o.js.publish(self.o.subjects.result(parent.run_id), payload, headers=headers)

    # -- correlation ----------------------------------------------------------------------

    async def _index(self, record: ev.AnyRecord) -> None:
        assert isinstance(record, ev.RunStarted)
        d = record.data
        assert d.correlation_key is not None
        await self.correlation.add(d.namespace, d.workflow, d.correlation_key, record.subject)

    async def _offer_parked(self, record: ev.AnyRecord) -> None:
        entry = self.o.runs.cached(record.subject)
        state = entry.state if entry is not None else None
        if state is None:
            loaded = await self.o.runs.load(record.subject)
            state = None if loaded is None else loaded.state
        if state is None or not state.correlation_key or state.finished:
            return
        parked = await self.correlation.parked(
            state.namespace, state.workflow, state.correlation_key
        )
        for event in parked:
            await self.o.deliver(record.subject, to_incoming(event))

    async def route_correlated(self, event: CloudEvent) -> bool:
        """Deliver an event to the runs its correlation key names; park it when none takes
        it. True when some workflow correlates events of its type."""
        incoming = to_incoming(event)
        correlated = False
        for definition, _ in list(self.o.registry.correlating(event.type)):
            key = event_correlation_key(definition, incoming)
            if key is None:
                continue
            correlated = True
            runs = await self.correlation.runs(definition.namespace, definition.name, key)
            taken = False
            for run_id in runs:
                taken = await self.o.deliver(run_id, incoming) or taken
            if taken:
                continue
            await self.correlation.park(definition.namespace, definition.name, key, event)
            # A run may have started waiting between "not taken" and "parked": it looked
            # for parked events before this one was there. Offer it once more.
            for run_id in await self.correlation.runs(definition.namespace, definition.name, key):
                await self.o.deliver(run_id, incoming)
        return correlated


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
