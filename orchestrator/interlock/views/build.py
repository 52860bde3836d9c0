"""The builders of :mod:`interlock.views`: each turns what was read (a run's log, a
definition, an index entry) into a view, and does no I/O."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from interlock.core import events as ev
from interlock.core.state import RunState, fold
from interlock.transport.cloudevents import too_deep
from interlock.views.chains import chain_view, history_view
from interlock.views.outline import WorkflowOutline, outline_of
from interlock.views.pauses import PauseView
from interlock.views.shapes import (
    TASK_EVENTS,
    AgentView,
    CapabilityView,
    DeadLetterView,
    ErrorView,
    GuardErrorView,
    MapView,
    PendingActionView,
    RunDescription,
    RunOrigin,
    RunResult,
    RunSummary,
    SlotView,
    TimerView,
    WaitingOn,
    WaitView,
    WorkerView,
    WorkflowDetail,
    WorkflowSummary,
)

if TYPE_CHECKING:
    from interlock.core.definition import Definition


def to_builtins(value: Any) -> Any:
    """A view (or list of views) as plain dicts and lists, ready for JSON or YAML."""
    return msgspec.to_builtins(value)


def waiting_text(waiting: Iterable[WaitingOn]) -> str:
    """What a run waits for, in words, by kind: ``approval approval.granted,
    approval.denied; timer to expired`` (as the console says it)."""
    by_kind: dict[str, list[str]] = {}
    for w in waiting:
        by_kind.setdefault(w.kind, []).append(f"to {w.name}" if w.kind == "timer" else w.name)
    return "; ".join(f"{kind} {', '.join(names)}" for kind, names in by_kind.items())


def waiting_of(outline: WorkflowOutline, state: str) -> list[WaitingOn]:
    """What ``state`` of a workflow waits for: the work it asks for, the events that move
    it (an approval's in a ``human_in_the_loop`` state), its timeout."""
    kind = outline.kinds.get(state)
    # The kinds' names as core.definition has them (imported, it would load the compiler
    # into every read command).
    if kind is None or kind == "terminal":
        return []
    out = [
        WaitingOn(kind="workflow", name=name.removeprefix("workflow:"))
        if name.startswith("workflow:")
        else WaitingOn(kind="agent", name=name)
        for name in (outline.asks or {}).get(state, [])
    ]
    events = "approval" if kind == "human_in_the_loop" else "event"
    for t in outline.transitions:
        if t.from_state == state and t.kind == "on" and t.event not in TASK_EVENTS:
            out.append(WaitingOn(kind=events, name=t.event))
    if state in outline.timeouts:
        out.append(WaitingOn(kind="timer", name=outline.timeouts[state]))
    return list(dict.fromkeys(out))


def summary_of(state: RunState, records: Sequence[ev.AnyRecord] = ()) -> RunSummary:
    """A summary folded from the run's own log (when the index is behind, or absent);
    ``records``: those read after the state's snapshot (a fork's run.forked among them
    gives its own start)."""
    started_at, forked_from = _fork_of(records, state.started_at)
    return RunSummary(
        run_id=state.run_id,
        workflow=state.workflow,
        namespace=state.namespace,
        version=state.version,
        status=state.status,
        state=state.state,
        started_at=started_at,
        forked_from=forked_from,
        updated_at=state.updated_at,
        error=ErrorView.of(state.error),
        paused=PauseView.of(None if state.finished else state.paused),
        continued_from=None if state.chain is None else state.chain.previous,
        continued_to=None if state.chain is None else state.chain.next,
    )


def _fork_of(records: Sequence[ev.AnyRecord], started_at: str) -> tuple[str, RunOrigin | None]:
    """(when the run started, its origin): a fork started when it was forked, and its
    copied run.started holds its origin's start."""
    for r in records:
        if type(r) is ev.RunForked:
            d = r.data
            return r.time, RunOrigin(
                run_id=d.origin_run_id, seq=d.origin_seq, started_at=started_at
            )
    return started_at, None


def _ending(records: Sequence[ev.AnyRecord]) -> tuple[str | None, str | None]:
    """(finished at, cancel reason) from a run's last record."""
    if not records:
        return None, None
    last = records[-1]
    if isinstance(last, ev.RunCancelled):
        return last.time, last.data.reason
    if isinstance(last, ev.RunCompleted | ev.RunFailed | ev.RunContinued):
        return last.time, None
    return None, None


def run_result(records: Sequence[ev.AnyRecord], state: RunState | None = None) -> RunResult:
    """How the run of ``records`` ended (or that it has not)."""
    state = state if state is not None else fold(records)
    finished_at, reason = _ending(records)
    return RunResult(
        run_id=state.run_id,
        status=state.status,
        state=state.state,
        outputs=state.outputs,
        error=ErrorView.of(state.error),
        reason=reason,
        finished_at=finished_at,
    )


def _waits(outline: WorkflowOutline | None, state: RunState) -> list[WaitView]:
    if outline is None or state.finished or state.state not in outline.kinds:
        return []
    correlated = set(outline.correlated)
    out = []
    for t in outline.transitions:
        if t.from_state != state.state or t.kind != "on":
            continue
        if t.event in TASK_EVENTS:
            kind = "answer"
        elif t.event in correlated:
            kind = "correlated"
        else:
            kind = "event"
        out.append(WaitView(event=t.event, kind=kind, goto=t.to_state, guard=t.guard))
    return out


def describe_run(
    records: Sequence[ev.AnyRecord],
    definition: WorkflowOutline | Definition | None = None,
    *,
    state: RunState | None = None,
    warnings: Sequence[str] = (),
) -> RunDescription:
    """Everything about a run from its log (and the outline of the definition it runs, or
    that definition, for what it waits for; without either ``waiting_for`` is empty).
    ``state``: the log folded already. ``warnings``: what the read of the log found wrong
    (foreign messages skipped)."""
    state = state if state is not None else fold(records)
    if definition is not None and not isinstance(definition, WorkflowOutline):
        definition = outline_of(definition)
    finished_at, reason = _ending(records)
    started_at, forked_from = _fork_of(records, state.started_at)
    pending = [
        PendingActionView(
            action_id=p.action_id,
            state=p.state,
            capability=p.capability if not p.workflow else f"workflow:{p.workflow}",
            attempt=p.attempt,
            max_attempts=p.retry.max_attempts if p.retry is not None else 1,
            requested_at=p.requested_at,
            deadline=p.deadline,
            item=p.item,
            iteration=p.iteration,
            held=(p.queued or ", ".join(c.limit for c in p.limits)) if p.held else None,
        )
        for p in sorted(state.pending.values(), key=lambda p: (p.index, p.item or 0))
    ]
    # An attempt's timeout counts from its admission: one scheduled before its request was
    # held (by a capability's pause) changes nothing when it fires, and is not shown.
    held = {p.action_id for p in state.pending.values() if p.held}
    timers = [
        TimerView(
            timer_id=t.timer_id,
            purpose=t.purpose,
            fire_at=t.fire_at,
            state=t.state,
            action_id=t.action_id,
        )
        for t in sorted(state.timers.values(), key=lambda t: t.fire_at)
        if not (t.purpose == "action-timeout" and t.action_id in held)
    ]
    return RunDescription(
        run_id=state.run_id,
        workflow=state.workflow,
        namespace=state.namespace,
        version=state.version,
        spec_hash=state.spec_hash,
        status=state.status,
        state=state.state,
        started_at=started_at,
        forked_from=forked_from,
        updated_at=state.updated_at,
        finished_at=finished_at,
        records=state.seq,
        inputs=dict(state.inputs),
        context=dict(state.context),
        pending=pending,
        waiting_for=_waits(definition, state),
        timers=timers,
        map=_map_view(state),
        outputs=state.outputs,
        error=ErrorView.of(state.error),
        reason=reason,
        correlation_key=state.correlation_key,
        parent_run=state.parent.run_id if state.parent is not None else None,
        trigger=state.trigger,
        guard_errors=guard_errors(records),
        warnings=list(warnings),
        queued=state.queued,
        slots=slot_views(state),
        window=_window(records),
        rate=_rate_hold(records) if state.queued else None,
        paused=PauseView.of(None if state.finished else state.paused),
        chain=chain_view(state),
        history=history_view(state),
    )


def _window(records: Sequence[ev.AnyRecord]) -> ev.TriggerWindow | None:
    first = records[0] if records else None
    return first.data.window if isinstance(first, ev.RunStarted) else None


def _rate_hold(records: Sequence[ev.AnyRecord]) -> ev.RateHold | None:
    """The rate a queued run waits for (None once its time came: the last ``run.queued``
    has none)."""
    for record in reversed(records):
        if isinstance(record, ev.RunQueued):
            return record.data.rate
    return None


def _map_view(state: RunState) -> MapView | None:
    """A map state's progress (None: the run is not in one)."""
    m = state.map
    if m is None or state.finished:
        return None
    return MapView(
        items=len(m.items),
        done=len(m.results),
        failed=len(m.failed),
        parallelism=m.parallelism,
        completion=m.completion,
    )


def slot_views(state: RunState) -> list[SlotView]:
    """The concurrency slots a run needs; held while it runs after its admission."""
    holding = not state.queued and not state.finished
    return [
        SlotView(limit=c.limit, key=c.key, size=c.size, holding=holding, fair=c.fair or None)
        for c in state.slots or ()
    ]


def guard_errors(records: Sequence[ev.AnyRecord]) -> list[GuardErrorView]:
    """Each ``guard.failed`` of a log, with the transition its decision took instead (the
    ``transition.fired`` after it that names it in ``guard_errors``), if any."""
    out: list[GuardErrorView] = []
    for i, record in enumerate(records):
        if not isinstance(record, ev.GuardFailed):
            continue
        g = record.data
        taken = None
        for later in records[i + 1 :]:
            if isinstance(
                later, ev.EventReceived | ev.ActionCompleted | ev.ActionFailed | ev.TimerFired
            ):
                break  # another decision
            if isinstance(later, ev.TransitionFired):
                if later.data.from_state == g.state and g.transition in later.data.guard_errors:
                    taken = later.data
                break
        out.append(
            GuardErrorView(
                state=g.state,
                transition=g.transition,
                event_type=g.event_type,
                guard=g.guard,
                error=g.error,
                time=record.time,
                taken=None if taken is None else taken.transition,
                to_state=None if taken is None else taken.to_state,
            )
        )
    return out


def workflow_summary_of(
    namespace: str, name: str, version: int, spec_hash: str, manifest: Mapping[str, Any]
) -> WorkflowSummary:
    """A summary from a stored manifest as it is (nothing compiled)."""
    spec = manifest.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    metadata = manifest.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    description = spec.get("description") or metadata.get("description")
    triggers = spec.get("triggers")
    events = {
        str(t["event"])
        for t in (triggers if isinstance(triggers, list) else [])
        if isinstance(t, Mapping) and "event" in t
    }
    return WorkflowSummary(
        namespace=namespace,
        name=name,
        version=version,
        spec_hash=spec_hash,
        description=description if isinstance(description, str) else None,
        triggers=sorted(events),
    )


def workflow_detail(
    definition: Definition, version: int, versions: Iterable[int]
) -> WorkflowDetail:
    """The detail of a compiled workflow (see :func:`workflow_detail_of`)."""
    return workflow_detail_of(
        definition.namespace,
        definition.name,
        version,
        versions,
        spec_hash=definition.spec_hash,
        manifest=definition.manifest,
        outline=outline_of(definition),
        source=definition.source,
    )


def workflow_detail_of(
    namespace: str,
    name: str,
    version: int,
    versions: Iterable[int],
    *,
    spec_hash: str,
    manifest: Mapping[str, Any],
    outline: WorkflowOutline,
    source: str = "",
) -> WorkflowDetail:
    """The detail of a stored workflow version from its manifest and outline (nothing
    compiled)."""
    return WorkflowDetail(
        namespace=namespace,
        name=name,
        version=version,
        versions=sorted(versions),
        spec_hash=spec_hash,
        description=outline.description,
        triggers=list(outline.triggers),
        inputs=dict(outline.inputs),
        states=list(outline.kinds),
        initial_state=outline.initial_state,
        manifest=_plain(manifest),
        kinds=dict(outline.kinds),
        transitions=list(outline.transitions),
        source=source or None,
    )


def _plain(value: Any) -> Any:
    """Mappings and sequences of a manifest as dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def agent_view(
    name: str,
    spec: Mapping[str, Any],
    workers: Sequence[Mapping[str, Any]],
    queues: Mapping[str, tuple[int, int]] | None = None,
) -> AgentView:
    """An AgentDef's stored spec and the heartbeats of live workers (all of them: those
    serving none of its capabilities are left out); ``queues``: (waiting, in progress)
    task requests per capability."""
    queues = queues or {}
    caps = [c for c in spec.get("capabilities", []) if isinstance(c, Mapping)]
    names = {str(c.get("name", "")) for c in caps}
    live = [w for w in workers if names & set(w.get("capabilities", []))]
    return AgentView(
        name=name,
        capabilities=[
            CapabilityView(
                name=str(c.get("name", "")),
                description=c.get("description"),
                timeout_s=_seconds(c.get("timeout_seconds")),
                max_retries=c.get("max_retries"),
                workers=sum(1 for w in live if c.get("name") in w.get("capabilities", [])),
                queued=queues[str(c.get("name"))][0] if str(c.get("name")) in queues else None,
                in_progress=(
                    queues[str(c.get("name"))][1] if str(c.get("name")) in queues else None
                ),
            )
            for c in caps
        ],
        workers=[worker_view(w) for w in live],
        spec=_plain(spec),
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    return None


def worker_view(w: Mapping[str, Any]) -> WorkerView:
    pid = w.get("pid")
    in_flight = w.get("in_flight")
    return WorkerView(
        name=str(w.get("name", "")),
        instance=str(w.get("instance", "")),
        capabilities=[str(c) for c in w.get("capabilities", [])],
        pid=pid if isinstance(pid, int) else None,
        host=w.get("host") if isinstance(w.get("host"), str) else None,
        in_flight=in_flight if isinstance(in_flight, int) else None,
        concurrency=w.get("concurrency") if isinstance(w.get("concurrency"), int) else None,
        started_at=w.get("started_at") if isinstance(w.get("started_at"), str) else None,
        heartbeat_at=w.get("heartbeat_at") if isinstance(w.get("heartbeat_at"), str) else None,
    )


def dead_letter_view(
    seq: int,
    time: str,
    reason: str,
    detail: str,
    subject: str,
    headers: dict[str, str],
    data: bytes,
    redrive_refusal: str | None = None,
) -> DeadLetterView:
    """A dead letter's data as JSON, else text, else base64: never a Python repr."""
    value: Any = None
    encoded = None
    if data:
        try:
            value = json.loads(data)
            # What a hostile sender nested must not stop a listing: shown as text below.
            if too_deep(value):
                raise ValueError("nested too deep")  # noqa: TRY301
        except (ValueError, RecursionError):
            try:
                value = data.decode("utf-8")
            except UnicodeDecodeError:
                encoded = base64.b64encode(data).decode("ascii")
    return DeadLetterView(
        seq=seq,
        time=time,
        reason=reason,
        detail=detail,
        subject=subject,
        headers=headers,
        data=value,
        data_base64=encoded,
        redrive_refusal=redrive_refusal,
    )


def record_view(record: ev.AnyRecord) -> dict[str, Any]:
    """A run-log record as its CloudEvent JSON object (what ``logs --output json`` prints)."""
    out: dict[str, Any] = msgspec.json.decode(ev.encode(record))
    return out
