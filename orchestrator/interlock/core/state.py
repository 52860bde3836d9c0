"""A run's state, and how each log record changes it (evolve); fold = reduce(evolve).

``evolve`` needs no definition: every value a record brings (context writes, outputs) is
in the record itself, so a log folds the same way forever, whatever became of the
manifest it ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.pauses import is_pause
from interlock.core.progress import Chain as Chain
from interlock.core.progress import DagProgress as DagProgress
from interlock.core.progress import MapProgress as MapProgress
from interlock.core.progress import PendingAction as PendingAction
from interlock.core.runstate import RunState as RunState
from interlock.core.seen import take, taken
from interlock.core.spawn import SpawnProgress
from interlock.core.statecodec import encode_state as encode_state
from interlock.core.vocabulary import RunStatus, StepStatus, TimerPurpose


def _run_started(s: RunState, r: ev.RunStarted) -> RunState:
    d = r.data
    if d.continued_from is not None:  # what it takes over is folded in
        plain = _run_started(s, replace(r, data=replace(d, continued_from=None)))
        return _taken_over(plain, d.continued_from)
    return RunState(
        run_id=r.subject,
        workflow=d.workflow,
        namespace=d.namespace,
        version=d.version,
        spec_hash=d.spec_hash,
        status=RunStatus.RUNNING,
        seq=s.seq + 1,
        started_at=r.time,
        updated_at=r.time,
        inputs=d.inputs,
        context=dict(d.context),
        traceparent=r.traceparent,
        trigger=d.trigger,
        correlation_key=d.correlation_key,
        parent=d.parent,
        spawn=SpawnProgress.of(d.spawn),
        history=d.history,
    )


def _taken_over(state: RunState, c: ev.ContinuedFrom) -> RunState:
    """The state after the ``run.started`` of a run continued from another (``state``:
    as a plain start leaves it): what it takes over, so it goes on where that one left."""
    return replace(
        state,
        states=dict(c.states),
        evidence=c.evidence,
        spent=c.spent,
        cost=c.cost,
        seen=dict.fromkeys(c.seen),
        chain=Chain(previous=c.run_id, link=c.link, state=c.state, reason=c.reason),
    )


def _run_continued(s: RunState, r: ev.RunContinued) -> RunState:
    """The state after ``run.continued``: ended, naming the run that goes on."""
    chain = s.chain or Chain()
    return replace(
        s,
        seq=s.seq + 1,
        updated_at=r.time,
        status=RunStatus.CONTINUED,
        pending={},
        timers={},
        chain=replace(chain, next=r.data.run_id),
    )


def _state_entered(s: RunState, r: ev.StateEntered) -> RunState:
    # A state's timers end with the visit; the run's deadline runs on.
    kept = (
        {k: t for k, t in s.timers.items() if t.purpose == TimerPurpose.RUN_DEADLINE}
        if s.timers
        else {}
    )
    return replace(
        s,
        seq=s.seq + 1,
        updated_at=r.time,
        state=r.data.state,
        next_action=0,
        pending={},
        timers=kept,
        map=None,
        dag=None,
        visit=s.seq + 1,
    )


def _action_requested(s: RunState, r: ev.ActionRequested) -> RunState:
    d = r.data
    pending = dict(s.pending)
    pending[d.action_id] = PendingAction(
        action_id=d.action_id,
        state=d.state,
        index=d.index,
        capability=d.capability,
        attempt=d.attempt,
        requested_at=r.time,
        deadline=d.deadline,
        retry=d.retry,
        workflow=d.workflow,
        item=d.item,
        iteration=d.iteration,
        step=d.step,
        limits=d.limits,
        held=bool(d.limits) and d.admitted_at is None,
        timeout_s=d.timeout_s if d.limits else None,
    )
    progress = s.map
    if d.item is not None and progress is not None:
        progress = replace(progress, next=max(progress.next, d.item + 1))
    dag = s.dag
    if d.step is not None and dag is not None:
        dag = replace(dag, status={**dag.status, d.step: StepStatus.RUNNING})
    spawn = s.spawn
    if spawn is not None:
        reserved = None if d.spawn is None else d.spawn.allowance
        spawn = spawn.charge(f"{d.action_id}#{d.attempt}", reserved)
    return replace(
        s,
        seq=s.seq + 1,
        updated_at=r.time,
        pending=pending,
        next_action=max(s.next_action, d.index + 1),
        actions=s.actions + 1,
        map=progress,
        dag=dag,
        spawn=spawn,
    )


def _action_completed(s: RunState, r: ev.ActionCompleted) -> RunState:
    d = r.data
    if d.cost is not None:
        s = replace(s, cost=(s.cost or 0.0) + d.cost)
    if d.spawns is not None and s.spawn is not None and d.action_id in s.pending:
        key = f"{d.action_id}#{s.pending[d.action_id].attempt}"
        s = replace(s, spawn=s.spawn.settle(key, d.spawns))
    pending = dict(s.pending)
    pending.pop(d.action_id, None)
    if d.item is not None and s.map is not None:
        progress = replace(s.map, results={**s.map.results, d.item: d.result})
        if s.map.at_least and d.source is not None:
            progress = replace(progress, sources={**s.map.sources, d.item: d.source})
        return replace(s, seq=s.seq + 1, updated_at=r.time, pending=pending, map=progress)
    if d.step is not None and s.dag is not None:
        dag = replace(
            s.dag,
            status={**s.dag.status, d.step: StepStatus.COMPLETED},
            results={**s.dag.results, d.step: d.result},
            sources=s.dag.sources if d.source is None else {**s.dag.sources, d.step: d.source},
        )
        context = {**s.context, **d.context_writes} if d.context_writes else s.context
        return replace(
            s, seq=s.seq + 1, updated_at=r.time, pending=pending, dag=dag, context=context
        )
    states = dict(s.states)
    states[d.state] = {"output": d.result}
    context = {**s.context, **d.context_writes} if d.context_writes else s.context
    return replace(
        s,
        seq=s.seq + 1,
        updated_at=r.time,
        pending=pending,
        states=states,
        result=d.result,
        context=context,
    )


def _action_failed(s: RunState, r: ev.ActionFailed) -> RunState:
    d = r.data
    if d.spawns is not None and s.spawn is not None:
        s = replace(s, spawn=s.spawn.settle(f"{d.action_id}#{d.attempt}", d.spawns))
    pending = dict(s.pending)
    pending.pop(d.action_id, None)
    progress = s.map
    if d.item is not None and progress is not None and not d.will_retry:
        # An item refused before it was requested (a spawn budget) is done with too.
        progress = replace(
            progress,
            failed={**progress.failed, d.item: d.error},
            next=max(progress.next, d.item + 1),
        )
    dag = s.dag
    if d.step is not None and dag is not None and not d.will_retry:
        dag = replace(
            dag,
            status={**dag.status, d.step: StepStatus.FAILED},
            errors={**dag.errors, d.step: d.error},
        )
    return replace(s, seq=s.seq + 1, updated_at=r.time, pending=pending, map=progress, dag=dag)


def _action_cancelled(s: RunState, r: ev.ActionCancelled) -> RunState:
    pending = dict(s.pending)
    pending.pop(r.data.action_id, None)
    return replace(s, seq=s.seq + 1, updated_at=r.time, pending=pending)


def _map_started(s: RunState, r: ev.MapStarted) -> RunState:
    d = r.data
    progress = MapProgress(
        items=d.items, parallelism=d.parallelism, completion=d.completion, at_least=d.at_least
    )
    return replace(s, seq=s.seq + 1, updated_at=r.time, map=progress)


def _map_completed(s: RunState, r: ev.MapCompleted) -> RunState:
    states = {**s.states, r.data.state: {"output": r.data.result}}
    return replace(s, seq=s.seq + 1, updated_at=r.time, states=states, result=r.data.result)


def _dag_started(s: RunState, r: ev.DagStarted) -> RunState:
    d = r.data
    dag = DagProgress(steps=d.steps, parallelism=d.parallelism, completion=d.completion)
    return replace(s, seq=s.seq + 1, updated_at=r.time, dag=dag)


def _step_skipped(s: RunState, r: ev.StepSkipped) -> RunState:
    dag = s.dag
    if dag is not None:
        dag = replace(dag, status={**dag.status, r.data.step: StepStatus.SKIPPED})
    return replace(s, seq=s.seq + 1, updated_at=r.time, dag=dag)


def _dag_completed(s: RunState, r: ev.DagCompleted) -> RunState:
    states = {**s.states, r.data.state: {"output": r.data.result}}
    return replace(s, seq=s.seq + 1, updated_at=r.time, states=states, result=r.data.result)


def _evidence_recorded(s: RunState, r: ev.EvidenceRecorded) -> RunState:
    event = r.data.event
    seen = taken(s.seen, event)
    evidence = dict(s.evidence or {})
    data = event.get("data")
    if isinstance(data, dict):
        for subject, proofs in data.items():
            if isinstance(proofs, dict):
                evidence[str(subject)] = {**evidence.get(str(subject), {}), **proofs}
    return replace(s, seq=s.seq + 1, updated_at=r.time, seen=seen, evidence=evidence)


def _gate_checked(s: RunState, r: ev.GateChecked) -> RunState:
    dag = s.dag
    if dag is not None and r.data.step:
        held = StepStatus.HELD
        status = held if not r.data.proven else dag.status.get(r.data.step, held)
        dag = replace(dag, status={**dag.status, r.data.step: status})
    return replace(s, seq=s.seq + 1, updated_at=r.time, dag=dag)


def _timer_scheduled(s: RunState, r: ev.TimerScheduled) -> RunState:
    timers = {**s.timers, r.data.timer_id: r.data}
    return replace(s, seq=s.seq + 1, updated_at=r.time, timers=timers)


def _timer_fired(s: RunState, r: ev.TimerFired) -> RunState:
    timers = dict(s.timers)
    timers.pop(r.data.timer_id, None)
    return replace(s, seq=s.seq + 1, updated_at=r.time, timers=timers)


def _event_received(s: RunState, r: ev.EventReceived) -> RunState:
    seen = taken(s.seen, r.data.event)
    return replace(s, seq=s.seq + 1, updated_at=r.time, seen=seen)


def _transition_fired(s: RunState, r: ev.TransitionFired) -> RunState:
    context = {**s.context, **r.data.set} if r.data.set else s.context
    spent = s.spent
    if r.data.budget:
        spent = dict(spent or {})
        for name in r.data.budget:
            spent[name] = spent.get(name, 0) + 1
    return replace(
        s,
        seq=s.seq + 1,
        updated_at=r.time,
        context=context,
        transitions=s.transitions + 1,
        spent=spent,
    )


def _run_completed(s: RunState, r: ev.RunCompleted) -> RunState:
    return replace(
        s,
        seq=s.seq + 1,
        updated_at=r.time,
        status=RunStatus.COMPLETED,
        outputs=r.data.outputs,
        pending={},
        timers={},
    )


def _run_failed(s: RunState, r: ev.RunFailed) -> RunState:
    return replace(
        s,
        seq=s.seq + 1,
        updated_at=r.time,
        status=RunStatus.FAILED,
        error=r.data.error,
        # Only a terminal state with `fail` returns outputs; other failures (and logs
        # written before there was such a state) leave them unset.
        outputs=r.data.outputs or s.outputs,
        pending={},
        timers={},
    )


def _run_cancelled(s: RunState, r: ev.RunCancelled) -> RunState:
    return replace(
        s, seq=s.seq + 1, updated_at=r.time, status=RunStatus.CANCELLED, pending={}, timers={}
    )


def _run_forked(s: RunState, r: ev.RunForked) -> RunState:
    d = r.data
    # A fork is a run of its own: it does not wait for the slots its origin waited for
    # in its state (it takes its own, then enters that state afresh).
    return replace(
        s, seq=s.seq + 1, updated_at=r.time, version=d.version, spec_hash=d.spec_hash, waits=None
    )


def _run_migrated(s: RunState, r: ev.RunMigrated) -> RunState:
    d = r.data
    slots = s.slots
    if d.freed:  # (the slots its new version asks for come in the run.queued after it)
        gone = {(c.limit, c.key) for c in d.freed}
        slots = [c for c in slots or () if (c.limit, c.key) not in gone] or None
    return replace(
        s, seq=s.seq + 1, updated_at=r.time, version=d.version, spec_hash=d.spec_hash, slots=slots
    )


def _counted(s: RunState, r: ev.Record) -> RunState:
    return replace(s, seq=s.seq + 1, updated_at=r.time)


def _run_queued(s: RunState, r: ev.RunQueued) -> RunState:
    if r.data.state is not None:  # a fork: in no state until admitted, then in that one
        return replace(
            s, seq=s.seq + 1, updated_at=r.time, slots=r.data.slots, state="", enters=r.data.state
        )
    if r.data.holds:  # migrated in its state: it holds what reaches it until admitted
        waits = s.waits or ev.RunPause(at=r.time)
        return replace(s, seq=s.seq + 1, updated_at=r.time, slots=r.data.slots, waits=waits)
    return replace(s, seq=s.seq + 1, updated_at=r.time, slots=r.data.slots)


def _run_admitted(s: RunState, r: ev.RunAdmitted) -> RunState:
    if s.enters is None and s.waits is None:
        return _counted(s, r)
    return replace(s, seq=s.seq + 1, updated_at=r.time, enters=None, waits=None)


def _pause(s: RunState, r: ev.RunPaused | ev.EventHeld | ev.RunResumed) -> RunState:
    """Paused; an event held while paused; resumed (see :mod:`interlock.core.runpause`)."""
    paused: ev.RunPause | None = None
    if isinstance(r, ev.RunPaused):
        paused = ev.RunPause(at=r.time, reason=r.data.reason, workflow=r.data.workflow)
    elif isinstance(r, ev.EventHeld):
        if s.paused is None and s.waits is not None:  # held until the run is admitted
            waits = replace(s.waits, held=[*s.waits.held, r.data.event])
            return replace(s, seq=s.seq + 1, updated_at=r.time, waits=waits)
        held = s.paused or ev.RunPause(at=r.time)
        paused = replace(held, held=[*held.held, r.data.event])
    return replace(s, seq=s.seq + 1, updated_at=r.time, paused=paused)


def _action_queued(s: RunState, r: ev.ActionQueued) -> RunState:
    """The request waits: held, its deadline void until it is admitted; a request held
    for its paused capability is in that line too."""
    d = r.data
    pending = s.pending.get(d.action_id)
    if pending is None or pending.attempt != d.attempt:
        return replace(s, seq=s.seq + 1, updated_at=r.time)
    limits = pending.limits
    if d.limit.endswith("@paused") and not any(c.limit == d.limit for c in limits):
        limits = [ev.SlotClaim(limit=d.limit, key=d.key, size=0), *limits]
    held = replace(
        pending, held=True, deadline=None, timeout_s=d.timeout_s, limits=limits, queued=d.limit
    )
    return replace(s, seq=s.seq + 1, updated_at=r.time, pending={**s.pending, d.action_id: held})


def _action_admitted(s: RunState, r: ev.ActionAdmitted) -> RunState:
    """The request goes out: no longer held, its deadline running (a paused capability's
    line is left behind)."""
    d = r.data
    pending = s.pending.get(d.action_id)
    if pending is None or pending.attempt != d.attempt:
        return replace(s, seq=s.seq + 1, updated_at=r.time)
    limits = [c for c in pending.limits if not is_pause(c)]
    admitted = replace(pending, held=False, deadline=d.deadline, limits=limits, queued="")
    return replace(
        s, seq=s.seq + 1, updated_at=r.time, pending={**s.pending, d.action_id: admitted}
    )


_EVOLVE: dict[type[ev.Record], Callable[[RunState, Any], RunState]] = {
    ev.RunStarted: _run_started,
    ev.StateEntered: _state_entered,
    ev.ActionRequested: _action_requested,
    ev.ActionCompleted: _action_completed,
    ev.ActionFailed: _action_failed,
    ev.ActionCancelled: _action_cancelled,
    ev.MapStarted: _map_started,
    ev.MapCompleted: _map_completed,
    ev.EventReceived: _event_received,
    ev.GuardFailed: _counted,
    ev.TransitionFired: _transition_fired,
    ev.TimerScheduled: _timer_scheduled,
    ev.TimerFired: _timer_fired,
    ev.RunCompleted: _run_completed,
    ev.RunFailed: _run_failed,
    ev.RunCancelled: _run_cancelled,
    ev.RunForked: _run_forked,
    ev.RunMigrated: _run_migrated,
    ev.DagStarted: _dag_started,
    ev.StepSkipped: _step_skipped,
    ev.DagCompleted: _dag_completed,
    ev.EvidenceRecorded: _evidence_recorded,
    ev.GateChecked: _gate_checked,
    ev.RunQueued: _run_queued,
    ev.RunAdmitted: _run_admitted,
    ev.RunPaused: _pause,
    ev.EventHeld: _pause,
    ev.RunResumed: _pause,
    ev.ActionQueued: _action_queued,
    ev.ActionAdmitted: _action_admitted,
    ev.RunContinued: _run_continued,
}


_record_encoder = msgspec.json.Encoder()


def evolve(state: RunState, record: ev.Record) -> RunState:
    """The state after one more record. Pure: ``state`` is not changed."""
    after = _EVOLVE[type(record)](state, record)
    return replace(after, size=after.size + len(_record_encoder.encode(record)))


def fold(records: Iterable[ev.Record], state: RunState | None = None) -> RunState:
    """The state after every record, in order, from ``state`` (or nothing): what evolve
    gives record by record, but the events a run remembers are copied once, not once per
    event received (the fold's own copy, changed in place; ``state`` is left as it was)."""
    current = state if state is not None else RunState()
    own: dict[str, None] = {}
    size = 0
    encode = _record_encoder.encode
    for record in records:
        if type(record) is ev.EventReceived:
            own = own if current.seen is own else dict(current.seen)
            take(own, record.data.event)
            current = replace(current, seq=current.seq + 1, updated_at=record.time, seen=own)
        else:
            current = _EVOLVE[type(record)](current, record)
        size += len(encode(record))
    # run.started starts the count afresh (a new state), and it is only ever first.
    return replace(current, size=current.size + size) if size else current
