"""What a program, the CLI and the HTTP API show of workflows, runs, agents and dead letters.

One set of shapes (msgspec Structs) for every reader: :class:`interlock.Client` returns
them, ``interlock ... --output json|yaml`` prints them, and the HTTP gateway answers with
them, so the three never disagree. Every builder here is pure: it turns what was read (a
run's log, a definition, an index entry) into a view, and does no I/O.

Encode a view with :func:`to_builtins` (plain dicts and lists, ready for JSON or YAML) or
``msgspec.json.encode``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from interlock.core import events as ev
from interlock.core.state import RunState, fold
from interlock.core.vocabulary import FINISHED

if TYPE_CHECKING:
    from interlock.core.definition import Definition
from interlock.transport.cloudevents import too_deep

__all__ = [
    "AgentView",
    "CapabilityView",
    "DeadLetterView",
    "EmitResult",
    "ErrorView",
    "MapView",
    "PendingActionView",
    "RunDescription",
    "RunResult",
    "RunSummary",
    "SignalResult",
    "StartedRun",
    "TimerView",
    "TransitionView",
    "WaitView",
    "WorkerView",
    "WorkflowDetail",
    "WorkflowSummary",
    "describe_run",
    "record_view",
    "run_result",
    "summary_from_index",
    "to_builtins",
]

TASK_EVENTS = frozenset({"task.completed", "task.failed"})
"""Transition events that an agent's answer (not an outside system) brings."""


class ErrorView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why an action or a run failed: its class (``timeout``, ``agent_error``...)."""

    error_class: str = msgspec.field(name="class")
    message: str
    code: str = ""

    @classmethod
    def of(cls, error: ev.ErrorInfo | None) -> ErrorView | None:
        if error is None:
            return None
        return cls(error_class=error.error_class, message=error.message, code=error.code)


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One line of a run list (``interlock runs``, ``GET /runs``)."""

    run_id: str
    workflow: str
    namespace: str = "default"
    version: int = 0
    status: str
    """``running``, ``completed``, ``failed`` or ``cancelled``."""
    state: str = ""
    """The state the run is in (or ended in)."""
    started_at: str = ""
    updated_at: str = ""
    error: ErrorView | None = None


class PendingActionView(msgspec.Struct, frozen=True, kw_only=True):
    """An action the run has asked for and not yet had answered."""

    action_id: str
    state: str
    capability: str
    """The capability asked (or ``workflow:<name>`` for a child workflow)."""
    attempt: int
    max_attempts: int
    requested_at: str
    deadline: str | None = None
    """When the attempt times out (None: no timeout)."""
    item: int | None = None
    """A map item's position."""
    iteration: int | None = None
    """A loop's iteration."""


class WaitView(msgspec.Struct, frozen=True, kw_only=True):
    """A transition out of the current state: the event that takes it, its guard, where it
    goes."""

    event: str
    kind: str
    """``answer`` (an agent's answer: task.completed / task.failed), ``event`` (an event
    sent to the run: ``interlock signal``, or ``emit`` with a ``runid``), or ``correlated``
    (an event that reaches the run by its correlation key)."""
    goto: str
    guard: str | None = None
    """The CEL guard; the transition fires only when it is ``true``."""


class TimerView(msgspec.Struct, frozen=True, kw_only=True):
    timer_id: str
    purpose: str
    """``action-timeout``, ``retry``, ``state-timeout`` or ``run-deadline``."""
    fire_at: str
    state: str | None = None
    action_id: str | None = None


class MapView(msgspec.Struct, frozen=True, kw_only=True):
    """A map state's progress."""

    items: int
    done: int
    failed: int
    parallelism: int
    completion: str


class RunDescription(msgspec.Struct, frozen=True, kw_only=True):
    """Everything about one run now (``interlock describe run``, ``GET /runs/{id}``)."""

    run_id: str
    workflow: str
    namespace: str
    version: int
    spec_hash: str
    status: str
    state: str
    started_at: str
    updated_at: str
    finished_at: str | None = None
    records: int
    """How many records the run's log holds."""
    inputs: dict[str, Any] = {}
    context: dict[str, Any] = {}
    pending: list[PendingActionView] = []
    waiting_for: list[WaitView] = []
    """What the current state waits for (empty once the run has finished)."""
    timers: list[TimerView] = []
    map: MapView | None = None
    outputs: dict[str, Any] | None = None
    error: ErrorView | None = None
    reason: str | None = None
    """A cancelled run's reason."""
    correlation_key: str | None = None
    parent_run: str | None = None
    trigger: dict[str, Any] | None = None
    """The CloudEvent that started the run, when a trigger did."""


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ended, or that it has not (``interlock result``, ``GET /runs/{id}/result``)."""

    run_id: str
    status: str
    state: str = ""
    outputs: dict[str, Any] | None = None
    error: ErrorView | None = None
    reason: str | None = None
    """A cancelled run's reason."""
    finished_at: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class StartedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run an emitted event starts (or had started before: ``existed``)."""

    run_id: str
    workflow: str
    namespace: str = "default"
    version: int = 0
    existed: bool = False
    """The event was seen before: the run it started then is the one named."""
    pending: bool = False
    """Not in the log yet when ``emit`` answered: no orchestrator had taken the event (is
    one running?). It starts when one does."""


class EmitResult(msgspec.Struct, frozen=True, kw_only=True):
    """What publishing an event did."""

    id: str
    type: str
    source: str
    seq: int
    """The event's sequence in the events stream."""
    duplicate: bool = False
    """An event with this source and id was published before; this one was dropped."""
    started: list[StartedRun] = []
    """The runs its triggers start (worked out with the orchestrator's own rules)."""
    run_id: str | None = None
    """The run the event was addressed to (its ``runid`` extension), if any."""

    @property
    def matched(self) -> bool:
        return bool(self.started) or self.run_id is not None


class SignalResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a run did with an event sent to it (``interlock signal``)."""

    run_id: str
    type: str
    id: str
    outcome: str
    """``moved`` (a transition fired), ``declined`` (the run took the event but no guard was
    true), ``not-waiting`` (the run's state does not wait for it: not sent), ``finished``
    (the run has ended: not sent) or ``unanswered`` (sent, and no orchestrator took it in
    time)."""
    state: str = ""
    """The state the run was in when the event arrived."""
    status: str = "running"
    """The run's status when the event was sent (or refused)."""
    to_state: str | None = None
    guard_errors: list[str] = []
    """Guards that failed to evaluate (they count as false)."""
    waiting_for: list[str] = []
    """For ``not-waiting``: the events the state does wait for."""


class CapabilityView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    timeout_s: float | None = None
    max_retries: int | None = None
    workers: int = 0
    """Live workers serving it."""
    queued: int | None = None
    """Task requests waiting for a worker (None: its queue is not there yet)."""
    in_progress: int | None = None
    """Task requests delivered to a worker and not yet acknowledged."""


class WorkerView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    instance: str
    capabilities: list[str] = []
    pid: int | None = None
    host: str | None = None
    in_flight: int | None = None
    concurrency: int | None = None
    started_at: str | None = None
    heartbeat_at: str | None = None


class AgentView(msgspec.Struct, frozen=True, kw_only=True):
    """An AgentDef and the live workers of its capabilities."""

    name: str
    capabilities: list[CapabilityView] = []
    workers: list[WorkerView] = []
    spec: dict[str, Any] = {}


class WorkflowSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow's newest version (``interlock workflows``, ``GET /workflows``)."""

    namespace: str
    name: str
    version: int
    spec_hash: str = ""
    description: str | None = None
    triggers: list[str] = []
    """The event types that start it."""


class TransitionView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One way out of a state, for drawing the state machine: an ``on`` entry
    (``on[index]``), a ``catch`` of error classes or a state ``timeout`` (the run's
    deadline is not drawn: it leaves every state)."""

    from_state: str = msgspec.field(name="from")
    to_state: str = msgspec.field(name="to")
    kind: str
    """``on``, ``catch`` or ``timeout``."""
    event: str = ""
    """The event an ``on`` entry waits for; the error classes of a ``catch``."""
    guard: str | None = None
    index: int | None = None
    """An ``on`` entry's position in its state (``transition`` in the log's records)."""


class WorkflowDetail(msgspec.Struct, frozen=True, kw_only=True):
    """One workflow: its versions and the newest manifest (``interlock get workflow``)."""

    namespace: str
    name: str
    version: int
    versions: list[int]
    spec_hash: str = ""
    description: str | None = None
    triggers: list[str] = []
    inputs: dict[str, Any] = {}
    states: list[str] = []
    initial_state: str = ""
    manifest: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    """Each state's kind (``task``, ``terminal``, ``human_in_the_loop``, ``map``...)."""
    transitions: list[TransitionView] = []
    """Every way from one state to another (what a diagram draws)."""


class DeadLetterView(msgspec.Struct, frozen=True, kw_only=True):
    """A message that could not be handled, with why (``interlock dead-letters``)."""

    seq: int
    time: str
    reason: str
    detail: str
    subject: str
    """Where it was first published (a redrive publishes it there again)."""
    headers: dict[str, str] = {}
    data: Any = None
    """The message's data: JSON when it is JSON, else text when it is UTF-8."""
    data_base64: str | None = None
    """The message's data when it is neither JSON nor UTF-8 text."""


# --- builders ---------------------------------------------------------------------------


def to_builtins(value: Any) -> Any:
    """A view (or list of views) as plain dicts and lists, ready for JSON or YAML."""
    return msgspec.to_builtins(value)


def summary_from_index(item: Mapping[str, Any]) -> RunSummary:
    """A run-index entry (the runs bucket the orchestrator keeps) as a summary."""
    error = item.get("error")
    return RunSummary(
        run_id=str(item.get("run_id", "")),
        workflow=str(item.get("workflow", "")),
        namespace=str(item.get("namespace", "default")),
        version=int(item.get("version", 0) or 0),
        status=str(item.get("status", "running")),
        state=str(item.get("state", "")),
        started_at=str(item.get("started_at", "")),
        updated_at=str(item.get("updated_at", "")),
        error=(
            ErrorView(error_class=str(error.get("class", "")), message=str(error.get("message")))
            if isinstance(error, Mapping)
            else None
        ),
    )


def summary_of(state: RunState) -> RunSummary:
    """A summary folded from the run's own log (when the index is behind, or absent)."""
    return RunSummary(
        run_id=state.run_id,
        workflow=state.workflow,
        namespace=state.namespace,
        version=state.version,
        status=state.status,
        state=state.state,
        started_at=state.started_at,
        updated_at=state.updated_at,
        error=ErrorView.of(state.error),
    )


def _ending(records: Sequence[ev.AnyRecord]) -> tuple[str | None, str | None]:
    """(finished at, cancel reason) from a run's last record."""
    if not records:
        return None, None
    last = records[-1]
    if isinstance(last, ev.RunCancelled):
        return last.time, last.data.reason
    if isinstance(last, ev.RunCompleted | ev.RunFailed):
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


def _waits(definition: Definition | None, state: RunState) -> list[WaitView]:
    if definition is None or state.finished or state.state not in definition.states:
        return []
    current = definition.states[state.state]
    correlated = set(definition.correlation.events) if definition.correlation else set()
    out = []
    for t in current.transitions:
        if t.event in TASK_EVENTS:
            kind = "answer"
        elif t.event in correlated:
            kind = "correlated"
        else:
            kind = "event"
        guard = t.guard.source if t.guard is not None else None
        out.append(WaitView(event=t.event, kind=kind, goto=t.goto, guard=guard))
    return out


def describe_run(
    records: Sequence[ev.AnyRecord], definition: Definition | None = None
) -> RunDescription:
    """Everything about a run from its log (and the definition it runs, for what it waits
    for; without it ``waiting_for`` is empty)."""
    state = fold(records)
    finished_at, reason = _ending(records)
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
        )
        for p in sorted(state.pending.values(), key=lambda p: (p.index, p.item or 0))
    ]
    timers = [
        TimerView(
            timer_id=t.timer_id,
            purpose=t.purpose,
            fire_at=t.fire_at,
            state=t.state,
            action_id=t.action_id,
        )
        for t in sorted(state.timers.values(), key=lambda t: t.fire_at)
    ]
    progress = None
    if state.map is not None and not state.finished:
        m = state.map
        progress = MapView(
            items=len(m.items),
            done=len(m.results),
            failed=len(m.failed),
            parallelism=m.parallelism,
            completion=m.completion,
        )
    return RunDescription(
        run_id=state.run_id,
        workflow=state.workflow,
        namespace=state.namespace,
        version=state.version,
        spec_hash=state.spec_hash,
        status=state.status,
        state=state.state,
        started_at=state.started_at,
        updated_at=state.updated_at,
        finished_at=finished_at,
        records=len(records),
        inputs=dict(state.inputs),
        context=dict(state.context),
        pending=pending,
        waiting_for=_waits(definition, state),
        timers=timers,
        map=progress,
        outputs=state.outputs,
        error=ErrorView.of(state.error),
        reason=reason,
        correlation_key=state.correlation_key,
        parent_run=state.parent.run_id if state.parent is not None else None,
        trigger=state.trigger,
    )


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


def workflow_summary(definition: Definition, version: int) -> WorkflowSummary:
    return WorkflowSummary(
        namespace=definition.namespace,
        name=definition.name,
        version=version,
        spec_hash=definition.spec_hash,
        description=_description(definition),
        triggers=sorted({t.event for t in definition.triggers}),
    )


def _description(definition: Definition) -> str | None:
    """``spec.description``, else ``metadata.description``."""
    if definition.description:
        return definition.description
    metadata = definition.manifest.get("metadata")
    found = metadata.get("description") if isinstance(metadata, Mapping) else None
    return found if isinstance(found, str) else None


def workflow_detail(
    definition: Definition, version: int, versions: Iterable[int]
) -> WorkflowDetail:
    inputs = {
        i.name: {
            "type": i.type,
            "required": i.required,
            **({"default": i.default} if i.has_default else {}),
        }
        for i in definition.inputs
    }
    return WorkflowDetail(
        namespace=definition.namespace,
        name=definition.name,
        version=version,
        versions=sorted(versions),
        spec_hash=definition.spec_hash,
        description=_description(definition),
        triggers=sorted({t.event for t in definition.triggers}),
        inputs=inputs,
        states=list(definition.states),
        initial_state=definition.initial_state,
        manifest=_plain(definition.manifest),
        kinds={name: state.kind for name, state in definition.states.items()},
        transitions=transitions_of(definition),
    )


def transitions_of(definition: Definition) -> list[TransitionView]:
    """Every edge of the state machine, state by state in the manifest's order."""
    out: list[TransitionView] = []
    for name, state in definition.states.items():
        for t in state.transitions:
            guard = t.guard.source if t.guard is not None else None
            out.append(
                TransitionView(
                    from_state=name,
                    to_state=t.goto,
                    kind="on",
                    event=t.event,
                    guard=guard,
                    index=t.index,
                )
            )
        for c in state.catches:
            out.append(
                TransitionView(
                    from_state=name, to_state=c.goto, kind="catch", event=",".join(sorted(c.errors))
                )
            )
        if state.timeout is not None:
            out.append(TransitionView(from_state=name, to_state=state.timeout.goto, kind="timeout"))
    return out


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
    )


def record_view(record: ev.AnyRecord) -> dict[str, Any]:
    """A run-log record as its CloudEvent JSON object (what ``logs --output json`` prints)."""
    out: dict[str, Any] = msgspec.json.decode(ev.encode(record))
    return out
