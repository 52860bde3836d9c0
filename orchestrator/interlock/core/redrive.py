"""A run's log cut into steps and re-driven through the engine. Pure.

Each external input a run took (its trigger and inputs, an agent's answer, an external
event or an evidence event, a due timer, a cancellation, a fork or a migration) begins one
*step*: the records one decision appended. :func:`redrive` feeds those inputs, in log order,
through :func:`~interlock.core.engine.decide` with a definition, mapping the ids the
recorded run used onto the ones the re-drive makes, so the analyses in
:mod:`interlock.core.analysis`, :mod:`interlock.core.replay` and :mod:`interlock.core.fork`
can compare the two logs.

What the orchestrator decided from outside the definition is taken as recorded, the way
an event is: an operator's pause and resume of the run (steps of their own), its
workflow's pause at its start (the run waits for the pause's slot), and when a limited
capability's request waited and was admitted (``action.queued``, ``action.admitted``,
made again for the new run's request after the step's own records), or was admitted at
once in its own record (``admitted_at``, made again on the new run's request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from interlock.core import capacity, runpause
from interlock.core import events as ev
from interlock.core.continuing import Carried
from interlock.core.definition import Definition, resolve_inputs
from interlock.core.engine import (
    TASK_FAILED,
    TIMER_FIRED,
    GuardCheck,
    Incoming,
    admit,
    cancel,
    decide,
    matching_trigger,
    migrate,
    resume,
    resume_fork,
    started,
    trigger_inputs,
)
from interlock.core.pauses import is_pause
from interlock.core.redrive_ids import map_action, map_timer
from interlock.core.state import RunState, evolve, fold
from interlock.core.vocabulary import RunStatus

REPLAY_SOURCE = "interlock://replay"


START = "start"


ANSWER = "answer"


EVENT = "event"


TIMER = "timer"


CANCEL = "cancel"


FORK = "fork"


MIGRATE = "migrate"


ADMIT = "admit"


PAUSE = "pause"


RESUME = "resume"


@dataclass(frozen=True, slots=True)
class Step:
    """The records one decision appended, and the input that caused it."""

    kind: str
    first: int
    """Log position (1-based) of the step's first record."""
    records: tuple[ev.AnyRecord, ...]

    @property
    def last(self) -> int:
        return self.first + len(self.records) - 1

    @property
    def head(self) -> ev.AnyRecord:
        return self.records[0]


def _starts_step(record: ev.AnyRecord) -> str | None:
    if isinstance(record, ev.RunStarted):
        return START
    if isinstance(record, ev.EventReceived | ev.EvidenceRecorded | ev.EventHeld):
        return EVENT
    if isinstance(record, ev.ActionCompleted):
        return ANSWER
    if isinstance(record, ev.ActionFailed):
        # An agent's failure is an answer, with its event's id. One without is the engine's
        # own, part of the decision that wrote it: a timeout's (the timer's step) or a
        # refused spawn's (the step that would have asked for it).
        return None if record.data.event_id is None else ANSWER
    if isinstance(record, ev.TimerFired):
        return TIMER
    if isinstance(record, ev.RunCancelled):
        return CANCEL
    if isinstance(record, ev.RunForked):
        return FORK
    if isinstance(record, ev.RunMigrated):
        return MIGRATE
    if isinstance(record, ev.RunAdmitted):
        return ADMIT
    if isinstance(record, ev.RunPaused):
        return PAUSE
    if isinstance(record, ev.RunResumed):
        return RESUME
    return None


def steps(records: Sequence[ev.AnyRecord]) -> list[Step]:
    """Cut a log into the decisions that appended it, each with the input behind it.

    A record of a type this version does not know to begin a decision stays with the step
    before it.
    """
    out: list[Step] = []
    current: list[ev.AnyRecord] = []
    kind = START
    first = 1
    held: set[str] = set()
    resuming: set[str] = set()
    for position, record in enumerate(records, start=1):
        begins = _starts_step(record)
        if isinstance(record, ev.RunResumed | ev.RunAdmitted):
            held, resuming = set(), held
        elif begins is not None and resuming:
            # What a paused (or waiting) run held is decided on in its resumption's (or
            # admission's) step; held again there when it still waits for its slots.
            if _input_id(record) in resuming:
                resuming.discard(_input_id(record) or "")
                if isinstance(record, ev.EventHeld):
                    held.add(str(record.data.event.get("id")))
                current.append(record)
                continue
            resuming = set()
        if isinstance(record, ev.EventHeld):
            held.add(str(record.data.event.get("id")))
        if begins is not None and current:
            out.append(Step(kind, first, tuple(current)))
            current = []
        if begins is not None:
            kind, first = begins, position
        current.append(record)
    if current:
        out.append(Step(kind, first, tuple(current)))
    return out


def _input_id(record: ev.AnyRecord) -> str | None:
    """The id of the input a step-beginning record took (as a held copy of it names it)."""
    if isinstance(record, ev.EventReceived | ev.EvidenceRecorded | ev.EventHeld):
        return str(record.data.event.get("id"))
    if isinstance(record, ev.ActionCompleted | ev.ActionFailed):
        return record.data.event_id
    if isinstance(record, ev.TimerFired):
        return record.data.timer_id
    return None


def boundaries(records: Sequence[ev.AnyRecord]) -> list[int]:
    """The log positions after which a decision was complete (where a fork may start)."""
    return [s.last for s in steps(records)]


def _answer(step: Step, action_id: str) -> Incoming:
    """The answer a step begins with, as the new run's action ``action_id`` receives it."""
    head = step.head
    if isinstance(head, ev.ActionCompleted):
        d = head.data
        return Incoming(
            type=d.event_type,
            source=d.source or REPLAY_SOURCE,
            id=d.event_id or head.id,
            data=d.result,
            time=head.time,
            extensions={"actionid": action_id},
        )
    assert isinstance(head, ev.ActionFailed)
    f = head.data
    error: dict[str, Any] = {"class": f.error.error_class, "message": f.error.message}
    if f.error.retryable:
        error["retryable"] = True
    if f.error.code:
        error["code"] = f.error.code
    if f.error.retry_after_s is not None:
        # Seconds from the failure's own time, which the re-drive decides at.
        error["retry_after"] = f.error.retry_after_s
    return Incoming(
        type=TASK_FAILED,
        source=f.source or REPLAY_SOURCE,
        id=f.event_id or head.id,
        data={"error": error},
        time=head.time,
        extensions={"actionid": action_id},
    )


def event_of(copy: dict[str, Any]) -> Incoming:
    """The incoming event an ``event.received`` record (or a run's trigger) holds a copy of."""
    return Incoming.from_dict(copy)


def describe_input(step: Step) -> dict[str, Any]:
    """The input behind a step, as JSON."""
    head = step.head
    out: dict[str, Any] = {"kind": step.kind}
    if isinstance(head, ev.RunStarted):
        out["inputs"] = head.data.inputs
        if head.data.trigger is not None:
            out["trigger"] = {k: head.data.trigger.get(k) for k in ("type", "source", "id")}
    elif isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        incoming = _answer(step, head.data.action_id)
        out.update(
            type=incoming.type, id=incoming.id, action_id=head.data.action_id, data=incoming.data
        )
        if head.data.source:
            out["source"] = head.data.source
    elif isinstance(head, ev.EventReceived | ev.EvidenceRecorded | ev.EventHeld):
        copy = head.data.event
        out.update(type=copy.get("type"), id=copy.get("id"), source=copy.get("source"))
        out["data"] = copy.get("data")
    elif isinstance(head, ev.TimerFired):
        out.update(timer_id=head.data.timer_id, purpose=head.data.purpose)
    elif isinstance(head, ev.RunCancelled):
        out["reason"] = head.data.reason
    elif isinstance(head, ev.RunForked):
        out.update(origin_run_id=head.data.origin_run_id, origin_seq=head.data.origin_seq)
    elif isinstance(head, ev.RunMigrated):
        out.update(from_version=head.data.from_version, version=head.data.version)
    elif isinstance(head, ev.RunAdmitted):
        out["limits"] = head.data.limits
    elif isinstance(head, ev.RunPaused):
        out["reason"] = head.data.reason
    return out


@dataclass(slots=True)
class Drive:
    """The new run a definition makes of a recorded run's inputs."""

    definition: Definition
    version: int
    state: RunState = field(default_factory=RunState)
    log: list[ev.AnyRecord] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)
    """Recorded action and timer ids -> the new run's, once the two logs have drifted."""

    def take(self, records: list[ev.AnyRecord]) -> None:
        for record in records:
            self.state = evolve(self.state, record)
        self.log.extend(records)


@dataclass(slots=True)
class Redriven:
    """What the definition did with one recorded step."""

    records: list[ev.AnyRecord]
    checks: list[GuardCheck]
    not_taken: str | None = None
    """Why the input changed nothing in the new run (it was not awaited there)."""


def _timer_named(data: ev.TimerFiredData) -> str:
    """``the retry timer``; a timer of an older log that names no purpose by its id."""
    return f"the {data.purpose} timer" if data.purpose else f"timer {data.timer_id}"


def run_step(drive: Drive, step: Step, recorded: RunState) -> Redriven:
    """Feed one recorded step's input to the new run. ``recorded``: the recorded run's
    state before the step."""
    outcome = _run_step(drive, step, recorded)
    d = drive.definition
    after = fold(outcome.records, drive.state)
    decided = (outcome.records, after)
    outcome.records, after = capacity.at_once_again(
        drive.definition, decided, step.records, drive.ids
    )
    outcome.records.extend(capacity.again(d, after, step.records, drive.ids))
    return outcome


def _run_step(drive: Drive, step: Step, recorded: RunState) -> Redriven:
    checks: list[GuardCheck] = []
    head = step.head
    now = head.time
    d = drive.definition
    if isinstance(head, ev.RunStarted):
        return _start(drive, step, head, checks)
    if drive.state.status == RunStatus.NEW:
        # Its start was not taken, or the log does not begin with one.
        return Redriven([], checks, "the new run never started")
    if drive.state.status != RunStatus.RUNNING:
        return Redriven([], checks, f"the new run has already ended ({drive.state.status})")
    if isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        return _answered(drive, step, head, recorded, checks)
    if isinstance(head, ev.EventReceived | ev.EvidenceRecorded | ev.EventHeld):
        if isinstance(head, ev.EventHeld):
            incoming = runpause.incoming(head.data.event)
        else:
            incoming = event_of(head.data.event)
        records = decide(d, drive.state, incoming, now, trace=checks)
        if not records:
            return Redriven(
                [], checks, f"state {drive.state.state!r} has no `on` entry for {incoming.type}"
            )
        return Redriven(records, checks)
    if isinstance(head, ev.RunPaused):
        p = head.data
        records = runpause.pause(drive.state, reason=p.reason, now=now, workflow=p.workflow)
        return Redriven(records, checks, None if records else "the new run is paused already")
    if isinstance(head, ev.RunResumed):
        records = resume(d, drive.state, now)
        return Redriven(records, checks, None if records else "the new run is not paused")
    if isinstance(head, ev.TimerFired):
        timer_id = map_timer(drive.ids, drive.state, recorded, head.data.timer_id)
        if timer_id is None:
            return Redriven(
                [],
                checks,
                f"{_timer_named(head.data)} is not set in the new run "
                f"(state {drive.state.state!r})",
            )
        incoming = Incoming(
            type=TIMER_FIRED, source=REPLAY_SOURCE, id=timer_id, extensions={"timerid": timer_id}
        )
        return Redriven(decide(d, drive.state, incoming, now, trace=checks), checks)
    if isinstance(head, ev.RunCancelled):
        return Redriven(cancel(d, drive.state, reason=head.data.reason, now=now), checks)
    if isinstance(head, ev.RunForked):
        return Redriven(_forked(drive, step, head), checks)
    if isinstance(head, ev.RunMigrated):
        version = drive.version or head.data.version
        queued = next((r for r in step.records if isinstance(r, ev.RunQueued)), None)
        freed = {(c.limit, c.key) for c in head.data.freed}
        slots = (
            [c for c in drive.state.slots or () if (c.limit, c.key) not in freed]
            if queued is None
            else queued.data.slots
        )
        return Redriven(migrate(d, drive.state, version=version, now=now, slots=slots), checks)
    if isinstance(head, ev.RunAdmitted):
        records = admit(d, drive.state, now)
        return Redriven(records, checks, None if records else "the new run is not queued")
    return Redriven([], checks, f"no input of type {ev.record_type(head)} to re-drive")


def _answered(
    drive: Drive,
    step: Step,
    head: ev.ActionCompleted | ev.ActionFailed,
    recorded: RunState,
    checks: list[GuardCheck],
) -> Redriven:
    action_id = map_action(drive.ids, drive.state, recorded, head.data.action_id)
    if action_id is None:
        old = recorded.pending.get(head.data.action_id)
        what = (
            f"{old.capability or old.workflow} (state {old.state!r}, action {old.index})"
            if old is not None
            else head.data.action_id
        )
        return Redriven(
            [],
            checks,
            f"the answer of {what} is not awaited: the new run is in state {drive.state.state!r}",
        )
    incoming = _answer(step, action_id)
    return Redriven(
        decide(drive.definition, drive.state, incoming, head.time, trace=checks), checks
    )


def _forked(drive: Drive, step: Step, head: ev.RunForked) -> list[ev.AnyRecord]:
    queued = next((r for r in step.records if isinstance(r, ev.RunQueued)), None)
    return resume_fork(
        drive.definition,
        drive.state,
        origin_run_id=head.data.origin_run_id,
        origin_seq=head.data.origin_seq,
        version=drive.version or head.data.version,
        now=head.time,
        slots=[] if queued is None else queued.data.slots,
    )


def recorded_slots(step: Step) -> list[ev.SlotClaim] | None:
    """The slots a start queued for as recorded (``[]``: it entered its first state at
    once; None: neither, as when it failed at its start): a re-drive takes them as
    recorded, whatever the definition declares, as the orchestrator's admission is."""
    for record in step.records:
        if isinstance(record, ev.RunQueued):
            return record.data.slots
    return [] if any(isinstance(r, ev.StateEntered) for r in step.records) else None


def _start(drive: Drive, step: Step, head: ev.RunStarted, checks: list[GuardCheck]) -> Redriven:
    d = drive.definition
    data = head.data
    version = drive.version if drive.version else data.version
    # Its workflow was paused when it started: it waited for the pause's slot first.
    paused = any(
        is_pause(c) for r in step.records if isinstance(r, ev.RunQueued) for c in r.data.slots
    )
    if data.continued_from is not None:
        # A run continued from another: it starts with what it took over, as recorded.
        carried = Carried(data.continued_from, data.context, data.correlation_key, data.trigger)
        records, _ = started(
            d,
            run_id=head.subject,
            inputs=data.inputs,
            now=head.time,
            version=version,
            traceparent=head.traceparent,
            parent=data.parent,
            spawn=data.spawn,
            trace=checks,
            history=data.history,
            carried=carried,
            paused=paused,
            slots=recorded_slots(step),
        )
        return Redriven(records, checks)
    trigger = None if data.trigger is None else event_of(data.trigger)
    given: dict[str, Any] = dict(data.inputs)
    # A window's run: its inputs are its events' (a batch) or its last event's, as recorded.
    if trigger is not None and data.window is None:
        found = matching_trigger(d, trigger)
        if found is None:
            return Redriven([], checks, f"no trigger of the workflow takes {trigger.type} any more")
        given = trigger_inputs(found, trigger)
    inputs, problems = resolve_inputs(d, given)
    if problems:
        return Redriven([], checks, "the inputs are no longer valid: " + "; ".join(problems))
    records, _ = started(
        d,
        run_id=head.subject,
        inputs=inputs,
        now=head.time,
        version=version,
        trigger=trigger,
        traceparent=head.traceparent,
        parent=data.parent,
        trace=checks,
        deadline_s=data.deadline_s,
        paused=paused,
        window=data.window,
        rate=next(
            (r.data.rate for r in step.records if isinstance(r, ev.RunQueued) and r.data.rate),
            None,
        ),
        history=data.history,
        slots=recorded_slots(step),
    )
    return Redriven(records, checks)


def redrive(
    records: Sequence[ev.AnyRecord], definition: Definition, *, version: int = 0
) -> list[ev.AnyRecord]:
    """The log ``definition`` writes from a recorded run's inputs, nothing compared.
    ``version``: the version the new run's start, fork or migration records name; 0 keeps
    the ones recorded."""
    drive = Drive(definition, version)
    recorded = RunState()
    for step in steps(records):
        drive.take(run_step(drive, step, recorded).records)
        recorded = fold(step.records, recorded)
    return drive.log
