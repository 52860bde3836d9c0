"""decide: (definition, state, incoming event, now) -> the next log records. Pure.

The shell reads a run's log, folds it, calls one of the functions here and appends what
comes back (optimistically: a stale sequence loses and decides again). Ids derive from the
run id and the log position, and time comes from the caller, so deciding twice on the same
input gives the same records, byte for byte.

The decision itself is built in layers: :mod:`~interlock.core.step` (emitting records),
:mod:`~interlock.core.transitions` (states and their transitions),
:mod:`~interlock.core.fanout` (map and parallel states),
:mod:`~interlock.core.dag` (DAG states: steps started as their dependencies end) and
:mod:`~interlock.core.reactions` (answers, failures and timers). What arrives from outside
(:class:`Incoming`, triggers, correlation keys) is in :mod:`~interlock.core.incoming`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from interlock.core import events as ev
from interlock.core import history, limits, runpause
from interlock.core.continuing import Carried, carried, handed_spawn
from interlock.core.definition import Definition
from interlock.core.history import limits as limits_of
from interlock.core.incoming import (
    TIMER_FIRED,
    Incoming,
    correlation_key,
    derive_run_id,
    event_correlation_key,
    matching_trigger,
    trigger_inputs,
    trigger_matches,
)
from interlock.core.migrating import migrate
from interlock.core.reactions import Reactions
from interlock.core.seen import event_key
from interlock.core.spawn import spawn_budget
from interlock.core.state import RunState, fold
from interlock.core.step import GuardCheck, backoff_seconds, plus_seconds
from interlock.core.vocabulary import (
    TASK_COMPLETED,
    TASK_FAILED,
    ErrorClass,
    RunStatus,
    TimerPurpose,
)

__all__ = [
    "TASK_COMPLETED",
    "TASK_FAILED",
    "TIMER_FIRED",
    "GuardCheck",
    "Incoming",
    "admit",
    "backoff_seconds",
    "cancel",
    "continuation",
    "correlation_key",
    "decide",
    "derive_run_id",
    "event_correlation_key",
    "matching_trigger",
    "migrate",
    "plus_seconds",
    "resume_fork",
    "start",
    "trigger_inputs",
    "trigger_matches",
]


def start(
    definition: Definition,
    *,
    run_id: str,
    inputs: Mapping[str, Any],
    now: str,
    version: int = 1,
    trigger: Incoming | None = None,
    traceparent: str | None = None,
    parent: ev.ParentRef | None = None,
    spawn: ev.SpawnBudget | None = None,
    trace: list[GuardCheck] | None = None,
    window: ev.TriggerWindow | None = None,
    rate: ev.RateHold | None = None,
    history: ev.HistoryLimits | None = None,
) -> list[ev.AnyRecord]:
    """The first records of a new run: started, then the initial state entered.

    ``inputs`` must already be resolved (see :func:`interlock.core.definition.resolve_inputs`).
    ``spawn`` is what a parent handed a child run (its depth and the tree's spawn budgets).
    ``trace``, when given, receives every guard weighed (it changes no record).
    """
    return started(
        definition,
        run_id=run_id,
        inputs=inputs,
        now=now,
        version=version,
        trigger=trigger,
        traceparent=traceparent,
        parent=parent,
        spawn=spawn,
        trace=trace,
        window=window,
        rate=rate,
        history=history,
    )[0]


def started(
    definition: Definition,
    *,
    run_id: str,
    inputs: Mapping[str, Any],
    now: str,
    version: int = 1,
    trigger: Incoming | None = None,
    traceparent: str | None = None,
    parent: ev.ParentRef | None = None,
    spawn: ev.SpawnBudget | None = None,
    trace: list[GuardCheck] | None = None,
    deadline_s: float | None = None,
    paused: bool = False,
    window: ev.TriggerWindow | None = None,
    rate: ev.RateHold | None = None,
    history: ev.HistoryLimits | None = None,
    carried: Carried | None = None,
    slots: list[ev.SlotClaim] | None = None,
) -> tuple[list[ev.AnyRecord], RunState]:
    """:func:`start`, and the run's state after its records (``fold(records)``, which
    making them has computed already). ``deadline_s``: the run's own deadline (seconds
    from now) over the workflow's ``spec.deadline.after``; 0 ends it at once. ``paused``:
    the workflow is paused: the run waits (``run.queued``) until it is resumed.
    ``history``: the history limits in force (:func:`interlock.core.history.limits`).
    ``carried``: what a run continued as new takes over (:func:`continuation`).
    ``slots``: the slots its ``run.queued`` named as recorded (a re-drive; ``[]``: it
    recorded none), whatever the definition declares."""
    step = Reactions(definition, RunState(), now, trace=trace)
    step._run_id = run_id
    step.emit(
        ev.RunStarted,
        ev.RunStartedData(
            workflow=definition.name,
            namespace=definition.namespace,
            version=version,
            spec_hash=definition.spec_hash,
            inputs=dict(inputs),
            context=dict(definition.context) if carried is None else carried.context,
            trigger=(
                carried.trigger
                if carried is not None
                else None
                if trigger is None
                else trigger.to_dict()
            ),
            correlation_key=(
                correlation_key(definition, inputs) if carried is None else carried.correlation_key
            ),
            parent=parent,
            spawn=spawn_budget(definition, spawn),
            deadline_s=deadline_s,
            window=window,
            history=history if history is not None else limits_of(definition),
            continued_from=None if carried is None else carried.continued_from,
        ),
        traceparent=traceparent,
    )
    if carried is not None:
        _go_on(step, definition, carried, inputs, paused=paused, slots=slots)
        return step.out, step.state
    after = deadline_s
    if after is None and definition.deadline is not None:
        after = definition.deadline.after_s
    if after is not None and after <= 0:
        # Out of time before anything starts: nothing is asked for (synapse's
        # --deadline 0 posts nothing), the run ends as its deadline says.
        step.deadline_passed(0.0)
        return step.out, step.state
    if after is not None:
        step.schedule(TimerPurpose.RUN_DEADLINE, plus_seconds(now, after))
    if (definition.concurrency or paused or rate) if slots is None else (slots or rate):
        # entered once admitted
        limits.queue(step, definition, inputs, trigger, paused=paused, rate=rate, recorded=slots)
        return step.out, step.state
    step.enter(definition.initial_state)
    return step.out, step.state


def _go_on(
    step: Reactions,
    definition: Definition,
    carried: Carried,
    inputs: Mapping[str, Any],
    *,
    paused: bool,
    slots: list[ev.SlotClaim] | None = None,
) -> None:
    """A continued run after its ``run.started``: its deadline as it was, then the state
    it goes on in (once admitted, when its workflow limits how many run at once)."""
    cf = carried.continued_from
    if cf.deadline_at is not None:
        step.schedule(TimerPurpose.RUN_DEADLINE, cf.deadline_at)
    if (definition.concurrency or paused) if slots is None else slots:
        trigger = None if carried.trigger is None else Incoming.from_dict(carried.trigger)
        limits.queue(step, definition, inputs, trigger, paused=paused, recorded=slots)
        return
    step.enter(cf.state)


def continuation(
    definition: Definition,
    state: RunState,
    record: ev.RunContinued,
    *,
    paused: bool = False,
) -> tuple[list[ev.AnyRecord], RunState]:
    """The first records of the run that continues the one whose state (after its
    ``run.continued``, ``record``) is ``state``: started with what it takes over, under
    the same version and limits, at the time of ``record`` (so that deciding it twice
    gives the same records), then in the state it goes on in."""
    return started(
        definition,
        run_id=record.data.run_id,
        inputs=record.data.inputs,
        now=record.time,
        version=state.version,
        traceparent=state.traceparent,
        parent=record.data.parent,
        spawn=handed_spawn(state),
        paused=paused,
        history=state.history or history.DEFAULT,  # as the run before, never recomputed
        carried=carried(state, record),
    )


def decide(
    definition: Definition,
    state: RunState,
    event: Incoming,
    now: str,
    *,
    trace: list[GuardCheck] | None = None,
) -> list[ev.AnyRecord]:
    """The records an incoming event adds to a run; empty when the run does not take it.

    The event is an agent's answer (extension ``actionid``), a due timer (type
    ``io.interlock.timer.fired``, extension ``timerid``) or an external event. ``trace``,
    when given, receives every guard weighed (it changes no record).
    """
    return decided(definition, state, event, now, trace=trace)[0]


def decided(
    definition: Definition,
    state: RunState,
    event: Incoming,
    now: str,
    *,
    trace: list[GuardCheck] | None = None,
) -> tuple[list[ev.AnyRecord], RunState]:
    """:func:`decide`, and the run's state after its records (``fold(records, state)``,
    which deciding has computed already)."""
    if state.status != RunStatus.RUNNING:
        return [], state
    holder = state.paused or state.waits
    if holder is not None:  # held if the run, resumed and admitted, would take it
        if len(holder.held) >= runpause.MAX_HELD:
            return [], state
        resumed = released(definition, state, now)
        if resumed.status != RunStatus.RUNNING:
            return [], state
        step = Reactions(definition, resumed, now)
        _react(step, definition, resumed, event)
        held = runpause.hold(state, event, now) if step.out else []
        return held, fold(held, state)
    step = Reactions(definition, state, now, trace=trace)
    _react(step, definition, state, event)
    if step.out and step.state.status == RunStatus.RUNNING:
        limit = history.over(step.state)
        if limit is not None:
            # The history limit: what would take the log past it is not recorded.
            step = Reactions(definition, state, now)
            step.fail_run(ErrorClass.HISTORY_EXCEEDED, history.exceeded_message(state, limit))
    return step.out, step.state


def _react(step: Reactions, definition: Definition, state: RunState, event: Incoming) -> None:
    """What :func:`decide` does with a running run: ``step`` gets the records."""
    if state.queued:  # waiting for its concurrency slots: only its deadline counts
        timer = state.timers.get(event.extensions.get("timerid", ""))
        if event.type == TIMER_FIRED and timer is not None:
            limits.deadline_while_queued(step, timer, state)
        return
    if event.type == TIMER_FIRED:
        timer = state.timers.get(event.extensions.get("timerid", ""))
        if timer is None:
            return  # already fired, or belonged to a state the run has left
        step.timer_fired(timer)
        return
    action_id = event.extensions.get("actionid")
    if action_id is not None:
        pending = state.pending.get(action_id)
        if pending is None or pending.held:
            # A duplicate, the answer to an action no longer awaited, or to a request
            # held for its capability's limits: never sent, so nobody can answer it.
            return
        attempt = event.extensions.get("attempt")
        if attempt is not None and attempt.isdigit() and int(attempt) != pending.attempt:
            return  # the answer to an earlier attempt that timed out
        step.action_answered(pending, event)
        return
    if event_key(event.source, event.id) in state.seen:
        return
    if event.type in definition.evidence_events:
        _evidence(step, event)
        return
    current = definition.states[state.state]
    if not current.transitions_for(event.type):
        return
    step.emit(ev.EventReceived, ev.EventReceivedData(event=event.to_dict()))
    gate = None if current.actions else current.gate
    if gate is not None and step.event_refused(current, gate, event):
        return  # not taken: the state goes on waiting
    step.route(event.type, event, None)


def _evidence(step: Reactions, event: Incoming) -> None:
    """Keep an evidence event whatever state the run is in; then route it like any event
    (a state may wait for it), or let a DAG's held steps see it."""
    step.evidence_before = step.state.evidence or {}
    step.emit(ev.EvidenceRecorded, ev.EvidenceRecordedData(event=event.to_dict()))
    current = step.current
    if step.route(event.type, event, None):
        return
    if current.dag is not None and step.running and step.state.dag is not None:
        step.advance_dag(current, current.dag)


def released(definition: Definition, state: RunState, now: str) -> RunState:
    """The state of a paused or waiting run once resumed and admitted (see
    :mod:`runpause`, :mod:`migrating`): what it would take then, it holds now."""
    if state.paused is not None:
        state = fold(resume(definition, state, now), state)
    if state.waits is not None and state.paused is None:
        state = fold(admit(definition, state, now), state)
    return state


def admit(definition: Definition, state: RunState, now: str) -> list[ev.AnyRecord]:
    """A queued run holds all its slots: ``run.admitted`` and its first state entered
    (:func:`limits.admitted`), or, a run migrated in its state, the events it held decided
    on in turn after it."""
    out = limits.admitted(definition, state, now)
    if not out or state.waits is None:
        return out
    current = fold(out, state)
    for event in state.waits.held:
        records, current = decided(definition, current, runpause.incoming(event), now)
        out += records
    return out


def resume(definition: Definition, state: RunState, now: str) -> list[ev.AnyRecord]:
    """``run.resumed`` of a paused run, then the records of each event it held decided on
    in turn (see :mod:`runpause`); nothing for a run that is not paused."""
    if state.status != RunStatus.RUNNING or state.paused is None:
        return []
    out: list[ev.AnyRecord] = [runpause.resumed(state, now)]
    current = fold(out, state)
    for event in state.paused.held:
        records, current = decided(definition, current, runpause.incoming(event), now)
        out += records
    return out


def cancel(definition: Definition, state: RunState, *, reason: str, now: str) -> list[ev.AnyRecord]:
    """Cancel a running run (its pending actions are in ``state.pending`` for the shell)."""
    if state.status != RunStatus.RUNNING:
        return []
    step = Reactions(definition, state, now)
    step.emit(
        ev.RunCancelled,
        ev.RunCancelledData(
            state=state.state,
            reason=reason,
            cancelled_actions=list(state.pending),
            parent=state.parent,
            spawns=step.spawns_spent(),
        ),
    )
    return step.out


def resume_fork(
    definition: Definition,
    state: RunState,
    *,
    origin_run_id: str,
    origin_seq: int,
    version: int,
    now: str,
    slots: list[ev.SlotClaim] | None = None,
    paused: bool = False,
) -> list[ev.AnyRecord]:
    """The records that turn a copied log prefix into a run of its own: the fork marker,
    then the state the run was in entered again under ``definition``, so its work is asked
    for afresh (with fresh deadlines and inputs rendered by this definition). Under the
    definition's concurrency limits the fork is a new run in flight: it waits for its
    slots first (``run.queued``), and enters that state once admitted. ``slots``: those
    the recorded fork queued for (a re-drive follows it; ``[]``: it did not queue).
    ``paused``: the workflow is paused: the fork waits for its resumption first, as a run
    started now does."""
    if state.status != RunStatus.RUNNING:
        return []
    step = Reactions(definition, state, now)
    step.emit(
        ev.RunForked,
        ev.RunForkedData(
            origin_run_id=origin_run_id,
            origin_seq=origin_seq,
            workflow=definition.name,
            namespace=definition.namespace,
            version=version,
            spec_hash=definition.spec_hash,
            state=state.state,
        ),
    )
    if (definition.concurrency or paused) if slots is None else slots:
        # A new run in flight: it waits for its slots as a run started now would.
        trigger = None if state.trigger is None else Incoming.from_dict(state.trigger)
        limits.queue(
            step,
            definition,
            state.inputs,
            trigger,
            paused=paused,
            enters=state.state,
            recorded=slots,
        )
        return step.out
    step.enter(state.state)
    return step.out
