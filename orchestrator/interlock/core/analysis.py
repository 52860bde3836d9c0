"""Why a run moved, and what another definition would have done with the same inputs. Pure.

A run's log holds every external input the run ever took: its trigger and inputs
(``run.started``), agents' answers (``action.completed`` / ``action.failed``), external
events (``event.received``, a full copy), due timers (``timer.fired``) and cancellation
(``run.cancelled``). Each of them begins one *step*: the records one decision appended.
Re-driving those inputs, in log order, through :func:`~interlock.core.engine.decide` with a
definition gives the log that definition would have written:

- with the run's own definition it gives the same records, and the engine's guard trace
  says why each step went where it did (:func:`explain`);
- with another definition, the first record where the two logs differ is where the new
  definition would have taken the run elsewhere, and why (:func:`replay`); over many runs,
  how a candidate would change recorded traffic (:func:`shadow`).

What a log cannot say is what an event the run ignored would have done: an event that
found no ``on`` entry in the run's state was never recorded. A re-drive therefore goes "as
far as the recorded inputs allow".

Everything here returns plain JSON-ready values; the shapes are documented in
docs/debugging.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.definition import Definition, resolve_inputs
from interlock.core.engine import (
    TASK_COMPLETED,
    TASK_FAILED,
    TIMER_FIRED,
    GuardCheck,
    Incoming,
    cancel,
    decide,
    matching_trigger,
    migrate,
    resume_fork,
    start,
    trigger_inputs,
)
from interlock.core.expr import ABSENT
from interlock.core.state import RunState, evolve, fold
from interlock.core.vocabulary import RunStatus, TimerPurpose

REPLAY_SOURCE = "interlock://replay"

# --- steps: a log cut into decisions ----------------------------------------------------

START = "start"
ANSWER = "answer"
EVENT = "event"
TIMER = "timer"
CANCEL = "cancel"
FORK = "fork"
MIGRATE = "migrate"


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


def _starts_step(record: ev.AnyRecord, previous: ev.AnyRecord | None) -> str | None:
    if isinstance(record, ev.RunStarted):
        return START
    if isinstance(record, ev.EventReceived):
        return EVENT
    if isinstance(record, ev.ActionCompleted):
        return ANSWER
    if isinstance(record, ev.ActionFailed):
        # A timeout's failure is part of the timer's step; an agent's failure is an answer.
        if record.data.event_id is None and isinstance(previous, ev.TimerFired):
            return None
        return ANSWER
    if isinstance(record, ev.TimerFired):
        return TIMER
    if isinstance(record, ev.RunCancelled):
        return CANCEL
    if isinstance(record, ev.RunForked):
        return FORK
    if isinstance(record, ev.RunMigrated):
        return MIGRATE
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
    previous: ev.AnyRecord | None = None
    for position, record in enumerate(records, start=1):
        begins = _starts_step(record, previous)
        if begins is not None and current:
            out.append(Step(kind, first, tuple(current)))
            current = []
        if begins is not None:
            kind, first = begins, position
        current.append(record)
        previous = record
    if current:
        out.append(Step(kind, first, tuple(current)))
    return out


def boundaries(records: Sequence[ev.AnyRecord]) -> list[int]:
    """The log positions after which a decision was complete (where a fork may start)."""
    return [s.last for s in steps(records)]


# --- what a step's input was --------------------------------------------------------------


def _answer(step: Step) -> Incoming:
    head = step.head
    if isinstance(head, ev.ActionCompleted):
        d = head.data
        return Incoming(
            type=d.event_type,
            source=d.source or REPLAY_SOURCE,
            id=d.event_id or head.id,
            data=d.result,
            time=head.time,
            extensions={"actionid": d.action_id},
        )
    assert isinstance(head, ev.ActionFailed)
    f = head.data
    error: dict[str, Any] = {"class": f.error.error_class, "message": f.error.message}
    if f.error.retryable:
        error["retryable"] = True
    if f.error.code:
        error["code"] = f.error.code
    return Incoming(
        type=TASK_FAILED,
        source=f.source or REPLAY_SOURCE,
        id=f.event_id or head.id,
        data={"error": error},
        time=head.time,
        extensions={"actionid": f.action_id},
    )


_EVENT_ATTRIBUTES = ("specversion", "id", "source", "type", "subject", "time", "data")


def event_of(copy: dict[str, Any]) -> Incoming:
    """The incoming event an ``event.received`` record (or a run's trigger) holds a copy of."""
    return Incoming(
        type=str(copy.get("type", "")),
        source=str(copy.get("source", "")),
        id=str(copy.get("id", "")),
        data=copy.get("data"),
        time=copy.get("time"),
        subject=copy.get("subject"),
        extensions={k: str(v) for k, v in copy.items() if k not in _EVENT_ATTRIBUTES},
    )


def describe_input(step: Step) -> dict[str, Any]:
    """The input behind a step, as JSON."""
    head = step.head
    out: dict[str, Any] = {"kind": step.kind}
    if isinstance(head, ev.RunStarted):
        out["inputs"] = head.data.inputs
        if head.data.trigger is not None:
            out["trigger"] = {k: head.data.trigger.get(k) for k in ("type", "source", "id")}
    elif isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        incoming = _answer(step)
        out.update(
            type=incoming.type, id=incoming.id, action_id=head.data.action_id, data=incoming.data
        )
        if head.data.source:
            out["source"] = head.data.source
    elif isinstance(head, ev.EventReceived):
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
    return out


# --- driving a definition with a log's inputs ---------------------------------------------


@dataclass(slots=True)
class _Drive:
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
class Outcome:
    """What the definition did with one recorded step."""

    records: list[ev.AnyRecord]
    checks: list[GuardCheck]
    not_taken: str | None = None
    """Why the input changed nothing in the new run (it was not awaited there)."""


def _pending_key(p: Any) -> tuple[Any, ...]:
    return (p.state, p.index, p.item, p.iteration)


def _map_action(drive: _Drive, recorded: RunState, action_id: str) -> str | None:
    """The new run's action that stands for a recorded one (same state, position, item)."""
    mapped = drive.ids.get(action_id, action_id)
    old = recorded.pending.get(action_id)
    found = drive.state.pending.get(mapped)
    if found is not None and (old is None or _pending_key(found) == _pending_key(old)):
        return mapped
    if old is None:
        return None
    for pending in drive.state.pending.values():
        if _pending_key(pending) == _pending_key(old):
            drive.ids[action_id] = pending.action_id
            return pending.action_id
    return None


def _map_timer(drive: _Drive, recorded: RunState, timer_id: str) -> str | None:
    mapped = drive.ids.get(timer_id, timer_id)
    if mapped in drive.state.timers:
        return mapped
    old = recorded.timers.get(timer_id)
    if old is None:
        return None
    action_id = None if old.action_id is None else drive.ids.get(old.action_id, old.action_id)
    for new in drive.state.timers.values():
        if (
            new.purpose == old.purpose
            and new.state == old.state
            and new.index == old.index
            and new.item == old.item
            and new.iteration == old.iteration
            and new.attempt == old.attempt
            and (old.action_id is None or new.action_id == action_id)
        ):
            drive.ids[timer_id] = new.timer_id
            return new.timer_id
    return None


def _run_step(drive: _Drive, step: Step, recorded: RunState) -> Outcome:
    """Feed one recorded step's input to the new run. ``recorded``: the recorded run's
    state before the step."""
    checks: list[GuardCheck] = []
    head = step.head
    now = head.time
    d = drive.definition
    if isinstance(head, ev.RunStarted):
        return _start(drive, head, checks)
    if drive.state.status != RunStatus.RUNNING:
        return Outcome([], checks, f"the new run has already ended ({drive.state.status})")
    if isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        action_id = _map_action(drive, recorded, head.data.action_id)
        if action_id is None:
            old = recorded.pending.get(head.data.action_id)
            what = (
                f"{old.capability or old.workflow} (state {old.state!r}, action {old.index})"
                if old is not None
                else head.data.action_id
            )
            return Outcome(
                [],
                checks,
                f"the answer of {what} is not awaited: the new run is in state "
                f"{drive.state.state!r}",
            )
        incoming = _answer(step)
        incoming = replace(incoming, extensions={"actionid": action_id})
        return Outcome(decide(d, drive.state, incoming, now, trace=checks), checks)
    if isinstance(head, ev.EventReceived):
        incoming = event_of(head.data.event)
        records = decide(d, drive.state, incoming, now, trace=checks)
        if not records:
            return Outcome(
                [], checks, f"state {drive.state.state!r} has no `on` entry for {incoming.type}"
            )
        return Outcome(records, checks)
    if isinstance(head, ev.TimerFired):
        timer_id = _map_timer(drive, recorded, head.data.timer_id)
        if timer_id is None:
            return Outcome(
                [],
                checks,
                f"the {head.data.purpose or 'timer'} timer is not set in the new run "
                f"(state {drive.state.state!r})",
            )
        incoming = Incoming(
            type=TIMER_FIRED, source=REPLAY_SOURCE, id=timer_id, extensions={"timerid": timer_id}
        )
        return Outcome(decide(d, drive.state, incoming, now, trace=checks), checks)
    if isinstance(head, ev.RunCancelled):
        return Outcome(cancel(d, drive.state, reason=head.data.reason, now=now), checks)
    if isinstance(head, ev.RunForked):
        records = resume_fork(
            d,
            drive.state,
            origin_run_id=head.data.origin_run_id,
            origin_seq=head.data.origin_seq,
            version=drive.version,
            now=now,
        )
        return Outcome(records, checks)
    if isinstance(head, ev.RunMigrated):
        return Outcome(migrate(d, drive.state, version=drive.version, now=now), checks)
    return Outcome([], checks, f"no input of type {ev.record_type(head)} to re-drive")


def _start(drive: _Drive, head: ev.RunStarted, checks: list[GuardCheck]) -> Outcome:
    d = drive.definition
    data = head.data
    trigger = None if data.trigger is None else event_of(data.trigger)
    given: dict[str, Any] = dict(data.inputs)
    if trigger is not None:
        found = matching_trigger(d, trigger)
        if found is None:
            return Outcome([], checks, f"no trigger of the workflow takes {trigger.type} any more")
        given = trigger_inputs(found, trigger)
    inputs, problems = resolve_inputs(d, given)
    if problems:
        return Outcome([], checks, "the inputs are no longer valid: " + "; ".join(problems))
    records = start(
        d,
        run_id=head.subject,
        inputs=inputs,
        now=head.time,
        version=drive.version if drive.version else data.version,
        trigger=trigger,
        traceparent=head.traceparent,
        parent=data.parent,
        trace=checks,
    )
    return Outcome(list(records), checks)


def redrive(
    records: Sequence[ev.AnyRecord], definition: Definition, *, version: int = 0
) -> list[ev.AnyRecord]:
    """The log ``definition`` writes from a recorded run's inputs, nothing compared."""
    drive = _Drive(definition, version)
    recorded = RunState()
    for step in steps(records):
        drive.take(_run_step(drive, step, recorded).records)
        recorded = fold(step.records, recorded)
    return drive.log


# --- comparing records -------------------------------------------------------------------

_VERSIONED = (ev.RunStarted, ev.RunForked, ev.RunMigrated)


def _comparable(record: ev.AnyRecord | None, like: ev.AnyRecord | None) -> Any:
    """A record as compared: what names the definition (its version and spec hash) is left
    out, and so are fields newer than the recorded log (an answer's ``source``, a request's
    ``traceparent``) when the recorded record has none."""
    if record is None:
        return None
    value = msgspec.to_builtins(record)
    if like is not None and like.traceparent is None:
        value.pop("traceparent", None)
    data = value.get("data", {})
    if isinstance(record, _VERSIONED):
        for key in ("version", "spec_hash", "from_version", "from_spec_hash"):
            data.pop(key, None)
    if (
        isinstance(record, ev.ActionCompleted | ev.ActionFailed)
        and isinstance(like, ev.ActionCompleted | ev.ActionFailed)
        and like.data.source is None
    ):
        data.pop("source", None)
    return value


def _differences(recorded: Any, replayed: Any, path: str = "") -> list[str]:
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        out: list[str] = []
        for key in [*recorded, *(k for k in replayed if k not in recorded)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in replayed:
                out.append(f"{where}: recorded {short(recorded[key])}, now absent")
            elif key not in recorded:
                out.append(f"{where}: not recorded, now {short(replayed[key])}")
            else:
                out.extend(_differences(recorded[key], replayed[key], where))
        return out
    if recorded != replayed or type(recorded) is not type(replayed):
        return [f"{path}: recorded {short(recorded)}, now {short(replayed)}"]
    return []


def short(value: Any) -> str:
    """A value as compact JSON, cut at 120 characters."""
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 120 else text[:117] + "..."


def record_json(record: ev.AnyRecord) -> dict[str, Any]:
    """A record as JSON (its CloudEvent, structured mode)."""
    out: dict[str, Any] = msgspec.to_builtins(record)
    return out


def summarize(record: ev.AnyRecord) -> str:
    """One line saying what a record means."""
    d: Any = record.data
    kind = ev.record_type(record).removeprefix(ev.PREFIX)
    if isinstance(record, ev.RunStarted):
        return f"{kind} {d.workflow} v{d.version}"
    if isinstance(record, ev.StateEntered):
        return f"{kind} {d.state}"
    if isinstance(record, ev.ActionRequested):
        target = d.workflow or d.capability
        return f"{kind} {target} input={short(d.input)}" + (
            f" (attempt {d.attempt})" if d.attempt > 1 else ""
        )
    if isinstance(record, ev.ActionCompleted):
        return f"{kind} {d.action_id} result={short(d.result)}"
    if isinstance(record, ev.ActionFailed):
        return f"{kind} {d.action_id} {d.error.error_class}: {d.error.message}"
    if isinstance(record, ev.EventReceived):
        return f"{kind} {d.event.get('type')} id={d.event.get('id')}"
    if isinstance(record, ev.GuardFailed):
        return f"{kind} {d.state} on[{d.transition}] `{d.guard}`: {d.error}"
    if isinstance(record, ev.TransitionFired):
        sets = f" set={short(d.set)}" if d.set else ""
        return f"{kind} {d.from_state} -> {d.to_state} on {d.event_type}{sets}"
    if isinstance(record, ev.TimerScheduled):
        return f"{kind} {d.purpose} at {d.fire_at}"
    if isinstance(record, ev.TimerFired):
        return f"{kind} {d.purpose or d.timer_id}"
    if isinstance(record, ev.RunCompleted):
        return f"{kind} in {d.state} outputs={short(d.outputs)}"
    if isinstance(record, ev.RunFailed):
        return f"{kind} {d.error.error_class}: {d.error.message}"
    if isinstance(record, ev.RunCancelled):
        return f"{kind}: {d.reason}"
    if isinstance(record, ev.RunForked):
        return f"{kind} from {d.origin_run_id} at {d.origin_seq}, v{d.version}, state {d.state}"
    if isinstance(record, ev.RunMigrated):
        return f"{kind} v{d.from_version} -> v{d.version}"
    if isinstance(record, ev.ActionCancelled):
        return f"{kind} {d.action_id}: {d.reason}"
    return kind


def record_line(position: int, record: ev.AnyRecord) -> dict[str, Any]:
    """A record as a line of a report: its position, type and summary."""
    return {"seq": position, "type": ev.record_type(record), "summary": summarize(record)}


def check_json(check: GuardCheck) -> dict[str, Any]:
    """A guard check as JSON."""
    out: dict[str, Any] = {
        "state": check.state,
        "event_type": check.event_type,
        "entry": check.transition,
        "goto": check.goto,
        "guard": check.guard,
        "outcome": check.outcome,
    }
    if check.guard is not None and check.outcome in ("fired", "false", "not_boolean"):
        out["value"] = check.value
    if check.error is not None:
        out["error"] = check.error
    if check.reads:
        out["reads"] = check.reads
    return out


def check_text(check: GuardCheck) -> str:
    """``result.score > 7``: result.score = 6, so false."""
    where = "catch" if check.transition < 0 else f"on[{check.transition}]"
    if check.guard is None:
        return f"{where} {check.event_type} -> {check.goto}: no guard, fired"
    reads = ", ".join(
        f"{k} is absent" if v == ABSENT else f"{k} = {short(v)}" for k, v in check.reads.items()
    )
    reads = f" ({reads})" if reads else ""
    if check.outcome == "fired":
        verdict = "true, fired"
    elif check.outcome == "false":
        verdict = "false"
    elif check.outcome == "error":
        verdict = f"error: {check.error} (fail-closed)"
    else:
        verdict = f"{short(check.value)}, not a boolean (fail-closed)"
    return f"{where} {check.event_type} -> {check.goto}: `{check.guard}`{reads}: {verdict}"


# --- replay against a definition ---------------------------------------------------------


def _states_named(record: ev.AnyRecord) -> list[str]:
    d: Any = record.data
    if isinstance(record, ev.TransitionFired):
        return [d.to_state]
    if isinstance(record, ev.StateEntered | ev.ActionRequested | ev.RunCompleted):
        return [d.state]
    return []


def _divergence(
    definition: Definition,
    step: Step,
    position: int,
    recorded: ev.AnyRecord | None,
    replayed: ev.AnyRecord | None,
    outcome: Outcome,
    before: RunState,
) -> dict[str, Any]:
    """Why the first differing record differs."""
    state = before.state
    event_type = _event_type(step)
    out: dict[str, Any] = {
        "seq": position,
        "state": state,
        "input": describe_input(step),
        "recorded": None if recorded is None else record_json(recorded),
        "replayed": None if replayed is None else record_json(replayed),
    }
    if outcome.checks:
        out["checks"] = [check_json(c) for c in outcome.checks]
    recorded_to = _goes_to(step)
    replayed_to = next(
        (r.data.to_state for r in outcome.records if isinstance(r, ev.TransitionFired)), None
    )
    missing = [
        s for s in (_states_named(recorded) if recorded else []) if s not in definition.states
    ]
    if state and state not in definition.states and step.kind != START:
        kind = "state_missing"
        reason = f"state {state!r}, where the run was, does not exist in the new definition"
        group = f"state {state!r} no longer exists"
    elif missing:
        kind = "state_missing"
        reason = (
            f"the run went to state {missing[0]!r}, which does not exist in the new definition"
            + (f" (it goes to {replayed_to!r} instead)" if replayed_to else "")
        )
        group = f"state {missing[0]!r} no longer exists"
    elif outcome.not_taken is not None:
        kind = {
            ANSWER: "answer_not_awaited",
            TIMER: "timer_not_set",
            EVENT: "event_not_taken",
            START: "not_started",
        }.get(step.kind, "input_not_taken")
        reason = outcome.not_taken
        group = _group_not_taken(kind, step, before, state)
    elif (
        isinstance(recorded, ev.ActionRequested)
        and isinstance(replayed, ev.ActionRequested)
        and recorded.data.state == replayed.data.state
        and recorded.data.index == replayed.data.index
        and recorded.data.input != replayed.data.input
    ):
        kind = "action_input"
        target = recorded.data.workflow or recorded.data.capability
        diffs = _differences(recorded.data.input, replayed.data.input, "input")
        reason = f"the input of {target} (state {recorded.data.state!r}) differs: " + "; ".join(
            diffs[:3]
        )
        group = f"input of {target} in state {recorded.data.state!r} differs"
        out["differences"] = diffs
    elif (
        recorded_to != replayed_to
        or isinstance(recorded, ev.TransitionFired | ev.GuardFailed)
        or (isinstance(replayed, ev.TransitionFired | ev.GuardFailed))
    ):
        kind = "guard"
        took = f"goes to {replayed_to!r}" if replayed_to else "takes no `on` entry"
        was = f"went to {recorded_to!r}" if recorded_to else "took no `on` entry"
        deciding = [c for c in outcome.checks if c.outcome != "fired"] or outcome.checks
        detail = "; ".join(check_text(c) for c in outcome.checks) or "no `on` entry matches"
        reason = f"on {event_type} in state {state!r} the run {was}; now it {took}: {detail}"
        group = (
            f"on {event_type} in {state!r}: {recorded_to or '(stays)'} -> "
            f"{replayed_to or '(stays)'}"
        )
        if deciding:
            out["guard"] = check_json(deciding[0])
    else:
        kind = "record"
        diffs = _differences(_comparable(recorded, recorded), _comparable(replayed, recorded))
        either = recorded if recorded is not None else replayed
        what = "record" if either is None else ev.record_type(either).removeprefix(ev.PREFIX)
        if recorded is None:
            reason = (
                "the logs differ"
                if replayed is None
                else f"the new definition writes one more record: {summarize(replayed)}"
            )
        elif replayed is None:
            reason = f"the new definition does not write {summarize(recorded)}"
        else:
            reason = f"{what} differs: " + "; ".join(diffs[:3])
        group = f"{what} in state {state!r} differs"
        out["differences"] = diffs
    out.update(kind=kind, reason=reason, group=group)
    return out


def _group_not_taken(kind: str, step: Step, before: RunState, state: str) -> str:
    head = step.head
    if isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        old = before.pending.get(head.data.action_id)
        what = old.capability if old is not None else "an action"
        return f"answer of {what} no longer awaited"
    if isinstance(head, ev.EventReceived):
        return f"{head.data.event.get('type')} not taken"
    if isinstance(head, ev.TimerFired):
        return f"{head.data.purpose or 'timer'} timer not set"
    return f"{kind} in {state!r}"


def _event_type(step: Step) -> str:
    head = step.head
    if isinstance(head, ev.ActionCompleted):
        return head.data.event_type
    if isinstance(head, ev.ActionFailed):
        return TASK_FAILED
    if isinstance(head, ev.EventReceived):
        return str(head.data.event.get("type", ""))
    if isinstance(head, ev.TimerFired):
        return f"timer {head.data.purpose}"
    return step.kind


def _goes_to(step: Step) -> str | None:
    return next((r.data.to_state for r in step.records if isinstance(r, ev.TransitionFired)), None)


def _end(state: RunState) -> dict[str, Any]:
    out: dict[str, Any] = {"status": state.status, "state": state.state}
    if state.outputs is not None:
        out["outputs"] = state.outputs
    if state.error is not None:
        out["error"] = {"class": state.error.error_class, "message": state.error.message}
    return out


def replay(
    records: Sequence[ev.AnyRecord],
    definition: Definition,
    *,
    version: int = 0,
    label: str = "",
) -> dict[str, Any]:
    """Re-drive a recorded run's inputs through ``definition`` and compare the logs.

    Returns the report documented in docs/debugging.md: ``agree``, the first
    ``divergence`` (its log position, kind, reason and both records), the records the new
    run goes on with after it (``continuation``), the inputs it could not take
    (``skipped``) and how each run ends.
    """
    if not records:
        raise ValueError("an empty log")
    drive = _Drive(definition, version)
    recorded = RunState()
    divergence: dict[str, Any] | None = None
    continuation: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for step in steps(records):
        outcome = _run_step(drive, step, recorded)
        new_first = drive.state.seq + 1
        if divergence is None:
            for k in range(max(len(step.records), len(outcome.records))):
                old = step.records[k] if k < len(step.records) else None
                new = outcome.records[k] if k < len(outcome.records) else None
                if _comparable(old, old) == _comparable(new, old):
                    continue
                divergence = _divergence(
                    definition, step, step.first + k, old, new, outcome, recorded
                )
                divergence["replayed_seq"] = new_first + k if new is not None else None
                continuation.extend(
                    record_line(new_first + j, r) for j, r in enumerate(outcome.records) if j >= k
                )
                break
        elif outcome.records:
            continuation.extend(
                record_line(new_first + j, r) for j, r in enumerate(outcome.records)
            )
        if divergence is not None and outcome.not_taken is not None:
            skipped.append(
                {"seq": step.first, "input": describe_input(step), "reason": outcome.not_taken}
            )
        drive.take(outcome.records)
        recorded = fold(step.records, recorded)
    return {
        "run_id": records[0].subject,
        "workflow": _workflow_of(records),
        "against": {
            "name": definition.name,
            "namespace": definition.namespace,
            "version": version or None,
            "spec_hash": definition.spec_hash,
            "label": label or None,
        },
        "agree": divergence is None,
        "records": len(records),
        "replayed": len(drive.log),
        "divergence": divergence,
        "continuation": continuation,
        "skipped": skipped,
        "recorded_end": _end(recorded),
        "replayed_end": _end(drive.state),
        "same_end": _end(recorded) == _end(drive.state),
    }


def _workflow_of(records: Sequence[ev.AnyRecord]) -> dict[str, Any]:
    state = fold(records)
    return {
        "name": state.workflow,
        "namespace": state.namespace,
        "version": state.version,
        "spec_hash": state.spec_hash,
    }


# --- explain -----------------------------------------------------------------------------


def explain(
    records: Sequence[ev.AnyRecord],
    definition: Definition,
    *,
    at: int | None = None,
    versions: Mapping[int, Definition] | None = None,
) -> dict[str, Any]:
    """Why the run went where it went: for each step, its input, every ``on`` entry that
    was weighed with the values its guard read, the entry that fired (or why none did), and
    what ``set`` and ``outputs`` produced; for a running run, what would move it now.

    ``definition`` must be the one the run ran (its version); when re-driving it does not
    give the recorded records, ``reproduces`` is false and says where. A run that moved
    between versions (a migration, a fork onto another version) is explained step by step
    with the version in force at each step when ``versions`` has it.
    """
    if not records:
        raise ValueError("an empty log")
    if at is not None and not 1 <= at <= len(records):
        raise ValueError(f"--at {at}: the log has records 1 to {len(records)}")
    drive = _Drive(definition, fold(records).version)
    recorded = RunState()
    explained: list[dict[str, Any]] = []
    mismatch: dict[str, Any] | None = None
    for step in steps(records):
        # Each step is weighed from the recorded state, whatever this definition did before,
        # by the version in force then.
        drive.state = recorded
        drive.definition = (versions or {}).get(version_of(step, recorded), definition)
        outcome = _run_step(drive, step, recorded)
        if mismatch is None:
            for k in range(max(len(step.records), len(outcome.records))):
                old = step.records[k] if k < len(step.records) else None
                new = outcome.records[k] if k < len(outcome.records) else None
                if _comparable(old, old) != _comparable(new, old):
                    mismatch = _divergence(
                        definition, step, step.first + k, old, new, outcome, recorded
                    )
                    break
        if at is None or step.first <= at <= step.last:
            explained.append(_explain_step(step, recorded, outcome))
        recorded = fold(step.records, recorded)
    # With --at: the run as it stood once the step holding record ``at`` was decided.
    final = recorded if at is None else fold(records[: explained[-1]["last"]])
    out: dict[str, Any] = {
        "run_id": records[0].subject,
        "workflow": _workflow_of(records),
        "definition": {"name": definition.name, "spec_hash": definition.spec_hash},
        "status": recorded.status,
        "reproduces": mismatch is None,
        "steps": explained,
    }
    if mismatch is not None:
        out["mismatch"] = {k: mismatch[k] for k in ("seq", "kind", "reason")}
    if final.status == RunStatus.RUNNING:
        out["waiting"] = waiting(definition, final)
    else:
        out["end"] = _end(final)
    return out


def version_of(step: Step, before: RunState) -> int:
    """The version of the workflow that made a step's decision."""
    head = step.head
    if isinstance(head, ev.RunStarted | ev.RunForked | ev.RunMigrated):
        return head.data.version
    return before.version


def versions_named(records: Iterable[ev.AnyRecord]) -> list[int]:
    """Every version of its workflow a log says the run was on, in order."""
    out: list[int] = []
    for record in records:
        if (
            isinstance(record, ev.RunStarted | ev.RunForked | ev.RunMigrated)
            and record.data.version not in out
        ):
            out.append(record.data.version)
    return out


def _explain_step(step: Step, before: RunState, outcome: Outcome) -> dict[str, Any]:
    records = step.records
    out: dict[str, Any] = {
        "seq": step.first,
        "last": step.last,
        "state": before.state or None,
        "input": describe_input(step),
        "checks": [check_json(c) for c in outcome.checks],
        "explanation": [check_text(c) for c in outcome.checks],
    }
    fired = next((r for r in records if isinstance(r, ev.TransitionFired)), None)
    if fired is not None:
        out["fired"] = {
            "entry": fired.data.transition,
            "from": fired.data.from_state,
            "to": fired.data.to_state,
            "on": fired.data.event_type,
            "set": fired.data.set,
        }
    else:
        out["fired"] = None
        out["why_none"] = _why_none(step, before, outcome)
    writes = [r.data.context_writes for r in records if isinstance(r, ev.ActionCompleted)]
    if any(writes):
        out["context_writes"] = {k: v for w in writes for k, v in w.items()}
    for record in records:
        if isinstance(record, ev.RunCompleted | ev.RunFailed) and record.data.outputs:
            out["outputs"] = record.data.outputs
    out["records"] = [record_line(step.first + i, r) for i, r in enumerate(records)]
    return out


def _why_none(step: Step, before: RunState, outcome: Outcome) -> str:
    head = step.head
    if step.kind == START:
        return "the run started"
    if step.kind in (CANCEL, FORK, MIGRATE):
        return f"a {step.kind}, not a transition"
    if outcome.checks:
        if all(c.outcome != "fired" for c in outcome.checks):
            return "every `on` entry for the event was weighed and none gave true"
        return "a catch took the failure"
    if isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        if any(isinstance(r, ev.ActionRequested) for r in step.records):
            return (
                "the state's next action was requested (no `on` entry is weighed before "
                "the state's last action is done)"
            )
        if any(isinstance(r, ev.RunFailed) for r in step.records):
            return "the failure was not caught: the run failed"
        if any(isinstance(r, ev.TimerScheduled) for r in step.records):
            return "the failure is retried after a backoff"
        return f"state {before.state!r} has no `on` entry for this answer"
    if isinstance(head, ev.TimerFired):
        return f"the {head.data.purpose} timer moved the run without a guard"
    return "no `on` entry applies"


def waiting(definition: Definition, state: RunState) -> dict[str, Any]:
    """What would move a running run now: the answers it awaits, the events (and their
    guards) its state takes, and its timers."""
    current = definition.states.get(state.state)
    answers = []
    for pending in state.pending.values():
        accepts = [TASK_COMPLETED, TASK_FAILED]
        if current is not None:
            accepts += [e for e in current.by_event if e not in accepts and e != TASK_FAILED]
        answers.append(
            {
                "action_id": pending.action_id,
                "capability": pending.workflow or pending.capability,
                "attempt": pending.attempt,
                "deadline": pending.deadline,
                "accepts": accepts,
            }
        )
    events = []
    if current is not None:
        for event_type, entries in current.by_event.items():
            if event_type in (TASK_COMPLETED, TASK_FAILED):
                continue
            events.append(
                {
                    "type": event_type,
                    "entries": [
                        {
                            "entry": t.index,
                            "guard": None if t.guard is None else t.guard.source,
                            "goto": t.goto,
                        }
                        for t in entries
                    ],
                }
            )
    timers = [
        {"timer_id": t.timer_id, "purpose": t.purpose, "fire_at": t.fire_at}
        for t in state.timers.values()
    ]
    if current is not None and current.timeout is not None:
        for timer in timers:
            if timer["purpose"] == TimerPurpose.STATE_TIMEOUT:
                timer["goto"] = current.timeout.goto
    return {"state": state.state, "answers": answers, "events": events, "timers": timers}


# --- shadow: a candidate over many runs ---------------------------------------------------


RUNS_LISTED = 50
"""How many run ids a shadow group lists (its ``count`` counts them all)."""


class Shadow:
    """Replays runs against a candidate one at a time (so only one log is held at once)
    and keeps the summary: how many agree, how many would end the same, and the divergent
    ones grouped by where and why, with one example of each group."""

    def __init__(self, candidate: Definition, *, version: int = 0, label: str = "") -> None:
        self.candidate = candidate
        self.version = version
        self.label = label
        self.total = self.agree = self.same_end = 0
        self.groups: dict[tuple[str, str], dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []

    def add(self, records: Sequence[ev.AnyRecord]) -> None:
        if not records:
            return
        self.total += 1
        try:
            report = replay(records, self.candidate, version=self.version, label=self.label)
        # A log this version cannot re-drive is reported, not fatal.
        except Exception as exc:  # noqa: BLE001
            self.errors.append({"run_id": records[0].subject, "error": str(exc)})
            return
        self.agree += report["agree"]
        self.same_end += report["same_end"]
        found = report["divergence"]
        if found is None:
            return
        key = (found["kind"], found["group"])
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = {
                "kind": found["kind"],
                "where": {
                    "state": found["state"],
                    "event_type": found["input"].get("type") or found["input"]["kind"],
                    "record": (found["recorded"] or found["replayed"] or {}).get("type"),
                },
                "why": found["group"],
                "count": 0,
                "same_end": 0,
                "runs": [],
                "example": {
                    "run_id": report["run_id"],
                    "seq": found["seq"],
                    "reason": found["reason"],
                    "recorded_end": report["recorded_end"],
                    "replayed_end": report["replayed_end"],
                },
            }
        group["count"] += 1
        group["same_end"] += report["same_end"]
        if len(group["runs"]) < RUNS_LISTED:
            group["runs"].append(report["run_id"])

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.groups.values(), key=lambda g: (-g["count"], g["why"]))
        return {
            "candidate": {
                "name": self.candidate.name,
                "namespace": self.candidate.namespace,
                "version": self.version or None,
                "spec_hash": self.candidate.spec_hash,
                "label": self.label or None,
            },
            "runs": self.total,
            "agree": self.agree,
            "diverge": self.total - self.agree - len(self.errors),
            "same_end": self.same_end,
            "groups": ordered,
            "errors": self.errors,
        }


def shadow(
    logs: Iterable[Sequence[ev.AnyRecord]],
    candidate: Definition,
    *,
    version: int = 0,
    label: str = "",
) -> dict[str, Any]:
    """Replay every log against ``candidate`` (see :class:`Shadow`)."""
    summary = Shadow(candidate, version=version, label=label)
    for records in logs:
        summary.add(records)
    return summary.summary()


# --- fork and migrate ----------------------------------------------------------------------


class NotPossible(ValueError):
    """A fork or a migration that cannot be made, with the reason."""


def _rename(value: str | None, old: str, new: str) -> str | None:
    if value is not None and value.startswith(old + ":"):
        return new + value[len(old) :]
    return value


def _copy_for(record: ev.AnyRecord, old: str, new: str) -> ev.AnyRecord:
    """A record of run ``old`` as the same record of run ``new``: its id, subject and the
    action and timer ids inside it (they derive from the run id) say ``new``."""
    data: Any = record.data
    changes: dict[str, Any] = {}
    for name in ("action_id", "timer_id"):
        value = getattr(data, name, None)
        if isinstance(value, str):
            changes[name] = _rename(value, old, new)
    if isinstance(record, ev.RunStarted):
        changes["parent"] = None  # a fork is a run of its own: it answers no parent
    if changes:
        data = replace(data, **changes)
    return replace(record, id=_rename(record.id, old, new) or record.id, subject=new, data=data)


def fork(
    records: Sequence[ev.AnyRecord],
    at: int,
    *,
    run_id: str,
    definition: Definition,
    version: int,
    now: str,
) -> list[ev.AnyRecord]:
    """The log of a new run: the first ``at`` records of ``records`` (as records of
    ``run_id``), a ``run.forked`` marker, and the state the run was in at ``at`` entered
    again under ``definition``, so its work is asked for afresh.

    ``at`` must end a decision (a log cut mid-decision is no state a run was ever in), and
    the run must still be running there, in a state ``definition`` has.
    """
    if not records:
        raise NotPossible("the log is empty")
    origin = records[0].subject
    if not 1 <= at <= len(records):
        raise NotPossible(f"--at {at}: the log has records 1 to {len(records)}")
    if run_id == origin:
        raise NotPossible("a fork needs a run id of its own")
    ends = boundaries(records)
    if at not in ends:
        # Suggest only the ends of decisions after which the run was still running.
        ends = [
            b for b in ends if not any(ev.record_type(r) in ev.TERMINAL_TYPES for r in records[:b])
        ]
        before = max((b for b in ends if b < at), default=None)
        after = min((b for b in ends if b > at), default=None)
        near = " or ".join(str(b) for b in (before, after) if b is not None)
        raise NotPossible(
            f"record {at} is in the middle of a decision; fork at the end of one ({near})"
        )
    prefix = list(records[:at])
    state = fold(prefix)
    if state.status != RunStatus.RUNNING:
        raise NotPossible(f"the run had already ended ({state.status}) at record {at}")
    if definition.name != state.workflow or definition.namespace != state.namespace:
        raise NotPossible(
            f"the run is of workflow {state.namespace}/{state.workflow}, "
            f"not {definition.namespace}/{definition.name}"
        )
    if state.state not in definition.states:
        raise NotPossible(
            f"at record {at} the run is in state {state.state!r}, which the definition "
            "forked onto does not have"
        )
    copied = [_copy_for(r, origin, run_id) for r in prefix]
    resumed = resume_fork(
        definition,
        fold(copied),
        origin_run_id=origin,
        origin_seq=at,
        version=version,
        now=now,
    )
    return copied + resumed


def acted_on(records: Sequence[ev.AnyRecord]) -> list[ev.AnyRecord]:
    """The records of an appended batch whose effects the shell should carry out.

    All of them, except in a fork's first batch: its copied history was acted on in the
    original run, so only the run's start (to index it) and the timers still set after the
    batch (the run's deadline) are kept from before the ``run.forked`` marker.
    """
    marker = next((i for i, r in enumerate(records) if isinstance(r, ev.RunForked)), None)
    if marker is None:
        return list(records)
    live = fold(records).timers
    kept = [
        r
        for r in records[:marker]
        if isinstance(r, ev.RunStarted)
        or (isinstance(r, ev.TimerScheduled) and r.data.timer_id in live)
    ]
    return kept + list(records[marker:])


def migration(
    records: Sequence[ev.AnyRecord], definition: Definition, *, version: int, now: str
) -> tuple[list[ev.AnyRecord], dict[str, Any]]:
    """The ``run.migrated`` record that moves a running run onto ``definition`` (empty when
    it cannot move) and the replay report that decided it."""
    report = replay(records, definition, version=version)
    state = fold(records)
    if state.status != RunStatus.RUNNING:
        report["migrate"] = f"the run has ended ({state.status})"
        return [], report
    if state.version == version and state.spec_hash == definition.spec_hash:
        report["migrate"] = f"the run is on version {version} already"
        return [], report
    if not report["agree"]:
        d = report["divergence"]
        report["migrate"] = f"its log diverges from version {version} at record {d['seq']}"
        return [], report
    report["migrate"] = None
    return migrate(definition, state, version=version, now=now), report
