"""Sending a named event to one run, and finding out what the run did with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from interlock.client import chains
from interlock.client.catalog import definition_of
from interlock.client.emitting import publish
from interlock.client.errors import no_stream_is_no_run
from interlock.core import events as ev
from interlock.core.cel_text import plain_cel_error
from interlock.core.vocabulary import RunStatus
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.views import GateView, SignalResult

if TYPE_CHECKING:
    from interlock.core.definition import Definition, TransitionDef
    from interlock.core.state import RunState
    from interlock.runtime.client import InterlockClient
    from interlock.runtime.waiting import RunWatcher


@dataclass(frozen=True, slots=True)
class Signal:
    """One event for one run: ``name`` with ``data``, from ``source``, with id ``id``."""

    run_id: str
    name: str
    data: Any
    source: str
    id: str


async def send(
    ops: InterlockClient, watcher: RunWatcher, signal: Signal, wait: float
) -> SignalResult:
    """Send ``signal`` unless the run would drop it, and wait up to ``wait`` seconds for
    the decision that took it (see :meth:`interlock.Client.signal`)."""
    async with no_stream_is_no_run(signal.run_id):
        # A run that continued as new: the signal goes to the newest run of its chain.
        read, followed = await chains.newest(ops, signal.run_id)
    run_id = followed[-1]
    state = read.state
    base = _SignalBase(
        run_id=run_id,
        type=signal.name,
        id=signal.id,
        state=state.state,
        status=state.status,
        addressed=signal.run_id if len(followed) > 1 else None,
        held_until="resumed" if state.paused else "admitted" if state.waits else None,
    )
    if state.finished:
        return base.result("finished")
    definition = await definition_of(ops, state)
    # A run queued for its slots is in no state yet: it takes no event until admitted.
    current = definition.states.get(state.state) if definition else None
    takes = current.transitions_for(signal.name) if current else ()
    # Evidence is kept whatever state the run is in (a gate reads it when checked). A
    # paused run holds what it will take once resumed, which may be a later state's: the
    # core says whether it would hold this one.
    held = (
        (state.paused is not None or state.waits is not None)
        and definition is not None
        and _would_hold(definition, state, signal)
    )
    if (
        definition is not None
        and not takes
        and not held
        and signal.name not in definition.evidence_events
    ):
        waits = sorted({t.event for t in current.transitions}) if current else []
        return base.result("not-waiting", waiting_for=waits)
    ce = CloudEvent(
        id=signal.id,
        source=signal.source,
        type=signal.name,
        time=utc_now(),
        datacontenttype="application/json" if signal.data is not None else None,
        data=signal.data,
        extensions={"runid": run_id},
    )
    hint = asyncio.Event()
    marker = signal.id.encode()

    def on_append(payload: bytes) -> None:
        if marker in payload:
            hint.set()

    await watcher.start()
    after = read.last
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    with watcher.listening(run_id, on_append):
        await publish(ops, ce)
        while True:
            # The log is read once the decision's append is heard (its payload names the
            # event: listened to since before the publish), not right after the publish,
            # when it would find nothing yet; at least every second, should a hint be lost.
            left = deadline - loop.time()
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hint.wait(), min(left, 1.0))
            hint.clear()
            found = await _decision_on(ops, run_id, after, signal.id)
            if found is not None:
                return _outcome(found, base, takes)
            if deadline - loop.time() <= 0:
                return base.result("unanswered")


def _would_hold(definition: Definition, state: RunState, signal: Signal) -> bool:
    """Whether the paused (or waiting) run would hold ``signal`` (it would take it once
    resumed and admitted)."""
    from interlock.core.engine import decide
    from interlock.core.incoming import Incoming

    probe = Incoming(
        type=signal.name,
        source=signal.source,
        id=signal.id,
        data=signal.data,
        extensions={"runid": signal.run_id},
    )
    return bool(decide(definition, state, probe, utc_now()))


async def _decision_on(
    ops: InterlockClient, run_id: str, after: int, event_id: str
) -> list[ev.AnyRecord] | None:
    """The decision (one log message) that took the event ``event_id``, if any yet."""
    for _, payload in await ops.log.read_raw(run_id, after):
        batch = ev.decode_batch(payload)
        for record in batch:
            # Evidence is kept as evidence.recorded, an event the state waits for as
            # event.received: either is the decision that took it.
            if (
                isinstance(record, ev.EventReceived | ev.EvidenceRecorded | ev.EventHeld)
                and record.data.event.get("id") == event_id
            ):
                return batch
    return None


@dataclass(frozen=True, slots=True)
class _SignalBase:
    run_id: str
    type: str
    id: str
    state: str
    status: str
    addressed: str | None = None
    held_until: str | None = None

    def result(
        self,
        outcome: str,
        *,
        state: str | None = None,
        to_state: str | None = None,
        guard_errors: list[str] | None = None,
        waiting_for: list[str] | None = None,
        gates: list[GateView] | None = None,
        ended: tuple[str, str | None, str | None] | None = None,
        declined: list[str] | None = None,
    ) -> SignalResult:
        return SignalResult(
            run_id=self.run_id,
            type=self.type,
            id=self.id,
            outcome=outcome,
            state=state if state is not None else self.state,
            status=self.status,
            to_state=to_state,
            guard_errors=guard_errors or [],
            waiting_for=waiting_for or [],
            gates=gates or [],
            after=None if ended is None else ended[0],
            error=None if ended is None else ended[1],
            declined=declined or [],
            addressed=self.addressed,
            continued_to=None if ended is None or len(ended) < 3 else ended[2],
            held_until=self.held_until if outcome == "held" else None,
        )


def _ended(batch: list[ev.AnyRecord]) -> tuple[str, str | None, str | None]:
    """The run's status after the decision ``batch``, its failure if it failed, and the run
    that continues it if it continued as new."""
    for record in batch:
        if isinstance(record, ev.RunFailed):
            error = record.data.error
            failure = f"{error.error_class}: {plain_cel_error(error.message)}"
            return RunStatus.FAILED, failure, None
        if isinstance(record, ev.RunCompleted):
            return RunStatus.COMPLETED, None, None
        if isinstance(record, ev.RunCancelled):
            return RunStatus.CANCELLED, record.data.reason or None, None
        if isinstance(record, ev.RunContinued):
            return RunStatus.CONTINUED, None, record.data.run_id
    return RunStatus.RUNNING, None, None


def _declined(batch: list[ev.AnyRecord], takes: Sequence[TransitionDef]) -> list[str]:
    """Why each transition on the event did not fire: its guard was false, or failed."""
    failed = {
        r.data.transition: plain_cel_error(r.data.error)
        for r in batch
        if isinstance(r, ev.GuardFailed)
    }
    out = []
    for t in takes:
        edge = f"on[{t.index}] {t.event} -> {t.goto}"
        if t.index in failed:
            out.append(f"{edge}: `{t.guard.source if t.guard else ''}` failed: {failed[t.index]}")
        elif t.guard is not None:
            out.append(f"{edge}: `{t.guard.source}` was false")
        else:
            out.append(f"{edge}: did not fire")
    return out


def _outcome(
    batch: list[ev.AnyRecord], base: _SignalBase, takes: Sequence[TransitionDef] = ()
) -> SignalResult:
    errors = [
        f"{r.data.guard}: {plain_cel_error(r.data.error)}"
        for r in batch
        if isinstance(r, ev.GuardFailed)
    ]
    ended = _ended(batch)
    gates = [
        GateView(
            state=r.data.state,
            step=r.data.step,
            subject=r.data.subject,
            proven=r.data.proven,
            missing=list(r.data.missing),
        )
        for r in batch
        if isinstance(r, ev.GateChecked)
    ]
    for record in batch:
        if isinstance(record, ev.TransitionFired) and record.data.event_id == base.id:
            return base.result(
                "moved",
                state=record.data.from_state,
                to_state=record.data.to_state,
                guard_errors=errors,
                gates=gates,
                ended=ended,
            )
    if any(isinstance(r, ev.EventHeld) for r in batch):
        return base.result("held")
    if any(isinstance(r, ev.EvidenceRecorded) for r in batch):
        return base.result("recorded", guard_errors=errors, gates=gates, ended=ended)
    return base.result(
        "declined", guard_errors=errors, ended=ended, declined=_declined(batch, takes)
    )
