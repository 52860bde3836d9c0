"""decide: (definition, state, incoming event, now) -> the next log records. Pure.

The shell reads a run's log, folds it, calls one of the functions here and appends what
comes back (optimistically: a stale sequence loses and decides again). Ids derive from the
run id and the log position, and time comes from the caller, so deciding twice on the same
input gives the same records, byte for byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.definition import ActionDef, Definition, StateDef, TriggerDef
from interlock.core.expr import ExpressionError, is_literal_true, render
from interlock.core.state import RUNNING, PendingAction, RunState, event_key, evolve

TASK_COMPLETED = "task.completed"
TASK_FAILED = "task.failed"


class Incoming(msgspec.Struct, frozen=True, kw_only=True):
    """A CloudEvent arriving at a run: an agent's answer or an external event.

    An agent's answer carries the ``actionid`` extension of the request it answers.
    """

    type: str
    source: str
    id: str
    data: Any = None
    time: str | None = None
    subject: str | None = None
    extensions: dict[str, str] = {}

    def to_dict(self) -> dict[str, Any]:
        """The structured-mode CloudEvent, as recorded in the log."""
        out: dict[str, Any] = {"specversion": "1.0", "id": self.id, "source": self.source}
        out["type"] = self.type
        if self.subject is not None:
            out["subject"] = self.subject
        if self.time is not None:
            out["time"] = self.time
        out.update(self.extensions)
        out["data"] = self.data
        return out


def derive_run_id(definition: Definition, source: str, event_id: str) -> str:
    """The run a trigger event starts: the same event never starts a second run."""
    key = f"{definition.namespace}/{definition.name}\n{source}\n{event_id}"
    return "r" + hashlib.sha256(key.encode()).hexdigest()[:24]


# --- triggers -------------------------------------------------------------------------


def _lookup(event: Incoming, path: tuple[str, ...]) -> tuple[bool, Any]:
    if path[0].startswith("$"):
        # $source, $subject, $type, $id or an extension ($runid...): CloudEvent attributes.
        name = path[0][1:]
        attrs = event.to_dict()
        if name == "data" or name not in attrs:
            return False, None
        node: Any = attrs[name]
        rest = path[1:]
    else:
        node, rest = event.data, path
    for key in rest:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _filter_matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, list) and not isinstance(actual, list):
        return any(_filter_matches(e, actual) for e in expected)
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    return bool(expected == actual)


def trigger_matches(trigger: TriggerDef, event: Incoming) -> bool:
    """The event's type is the trigger's and every filter entry matches."""
    if trigger.event != event.type:
        return False
    for path, expected in trigger.filter:
        found, actual = _lookup(event, path)
        if not found or not _filter_matches(expected, actual):
            return False
    return True


def matching_trigger(definition: Definition, event: Incoming) -> TriggerDef | None:
    """The first of the workflow's triggers the event fires, if any."""
    for trigger in definition.triggers:
        if trigger_matches(trigger, event):
            return trigger
    return None


def trigger_inputs(trigger: TriggerDef, event: Incoming) -> dict[str, Any]:
    """Run inputs from a trigger event: its ``input`` mapping, else the event's data."""
    if trigger.input is not None:
        rendered = render(trigger.input, {"event": event.to_dict(), "data": event.data})
        return rendered if isinstance(rendered, dict) else {}
    return dict(event.data) if isinstance(event.data, dict) else {}


# --- deciding -------------------------------------------------------------------------


def _plus_seconds(now: str, seconds: float) -> str:
    moment = datetime.fromisoformat(now.replace("Z", "+00:00")) + timedelta(seconds=seconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class _Step:
    """One decision: emits records and keeps the state after each of them."""

    definition: Definition
    state: RunState
    now: str
    out: list[ev.AnyRecord] = field(default_factory=list)

    def emit(self, cls: type[ev.AnyRecord], data: Any, traceparent: str | None = None) -> None:
        seq = self.state.seq + 1
        run_id = self.state.run_id or self._run_id
        record = cls(
            specversion="1.0",
            id=f"{run_id}:{seq}",
            source=ev.SOURCE,
            subject=run_id,
            time=self.now,
            datacontenttype="application/json",
            traceparent=traceparent,
            data=data,
        )
        self.state = evolve(self.state, record)
        self.out.append(record)

    _run_id: str = ""

    @property
    def current(self) -> StateDef:
        return self.definition.states[self.state.state]

    def activation(self, event: Incoming | None = None, result: Any = None) -> dict[str, Any]:
        s = self.state
        act: dict[str, Any] = {
            "inputs": s.inputs,
            "context": s.context,
            "states": s.states,
            "result": s.result if result is None else result,
            "run": {
                "id": s.run_id,
                "workflow": s.workflow,
                "namespace": s.namespace,
                "version": s.version,
                "started_at": s.started_at,
                "state": s.state,
            },
        }
        if event is not None:
            act["event"] = event.to_dict()
            act["data"] = event.data
        else:
            act["event"] = {}
            act["data"] = None
        return act

    # -- running a state ---------------------------------------------------------------

    def enter(self, name: str) -> None:
        self.emit(ev.StateEntered, ev.StateEnteredData(state=name))
        state = self.current
        if state.terminal:
            self.complete(state)
        elif state.actions:
            self.request(0)

    def complete(self, state: StateDef) -> None:
        outputs: dict[str, Any] = {}
        act = self.activation()
        for key, value in state.outputs or ():
            try:
                outputs[key] = render(value, act)
            except ExpressionError as exc:
                self.fail_run("expression_error", f"output {key!r} of state {state.name!r}: {exc}")
                return
        self.emit(ev.RunCompleted, ev.RunCompletedData(state=state.name, outputs=outputs))

    def request(self, index: int) -> None:
        state = self.current
        action: ActionDef = state.actions[index]
        try:
            payload = render(action.input, self.activation())
        except ExpressionError as exc:
            self.fail_run(
                "expression_error", f"input of action {index} in state {state.name!r}: {exc}"
            )
            return
        seq = self.state.seq + 1
        deadline = None if action.timeout_s is None else _plus_seconds(self.now, action.timeout_s)
        self.emit(
            ev.ActionRequested,
            ev.ActionRequestedData(
                action_id=f"{self.state.run_id}:{seq}",
                state=state.name,
                index=index,
                capability=action.capability,
                input=payload,
                timeout_s=action.timeout_s,
                deadline=deadline,
            ),
        )

    def fail_run(self, error_class: str, message: str) -> None:
        self.emit(
            ev.RunFailed,
            ev.RunFailedData(
                state=self.state.state,
                error=ev.ErrorInfo(error_class=error_class, message=message),
            ),
        )

    def route(self, event_type: str, event: Incoming | None, result: Any = None) -> bool:
        """Fire the first transition of the current state that the event takes."""
        state = self.current
        candidates = state.transitions_for(event_type)
        if not candidates:
            return False
        act = self.activation(event, result)
        for t in candidates:
            if t.guard is not None:
                try:
                    value = t.guard.evaluate(act)
                except ExpressionError as exc:
                    self._guard_failed(state, t.index, event_type, t.guard.source, str(exc))
                    continue
                if not is_literal_true(value):
                    if not isinstance(value, bool):
                        self._guard_failed(
                            state,
                            t.index,
                            event_type,
                            t.guard.source,
                            f"guard gave {type(value).__name__} {value!r}, not a boolean",
                        )
                    continue
            writes: dict[str, Any] = {}
            for key, value_def in t.set:
                try:
                    writes[key] = render(value_def, act)
                except ExpressionError as exc:
                    self.fail_run("expression_error", f"set {key!r} on {event_type}: {exc}")
                    return True
            self.emit(
                ev.TransitionFired,
                ev.TransitionFiredData(
                    from_state=state.name,
                    to_state=t.goto,
                    event_type=event_type,
                    event_id=None if event is None else event.id,
                    transition=t.index,
                    set=writes,
                ),
            )
            self.enter(t.goto)
            return True
        return False

    def _guard_failed(
        self, state: StateDef, index: int, event_type: str, guard: str, error: str
    ) -> None:
        self.emit(
            ev.GuardFailed,
            ev.GuardFailedData(
                state=state.name, transition=index, event_type=event_type, guard=guard, error=error
            ),
        )

    # -- answers from agents -----------------------------------------------------------

    def action_answered(self, pending: PendingAction, event: Incoming) -> None:
        action = self.current.actions[pending.index]
        if event.type == TASK_FAILED:
            self.action_failed(pending, _error_of(event.data), event)
            return
        result = event.data
        writes: dict[str, Any] = {}
        if isinstance(result, dict):
            writes = {ctx: result.get(key) for key, ctx in action.output}
        self.emit(
            ev.ActionCompleted,
            ev.ActionCompletedData(
                action_id=pending.action_id,
                state=pending.state,
                index=pending.index,
                result=result,
                event_type=event.type,
                event_id=event.id,
                context_writes=writes,
            ),
        )
        if event.type != TASK_COMPLETED and self.route(event.type, event, result):
            return
        if pending.index + 1 < len(self.current.actions):
            self.request(pending.index + 1)
            return
        self.route(TASK_COMPLETED, event, result)

    def action_failed(
        self, pending: PendingAction, error: ev.ErrorInfo, event: Incoming | None
    ) -> None:
        self.emit(
            ev.ActionFailed,
            ev.ActionFailedData(
                action_id=pending.action_id,
                state=pending.state,
                index=pending.index,
                error=error,
                attempt=pending.attempt,
                event_id=None if event is None else event.id,
            ),
        )
        failure = {"error": {"class": error.error_class, "message": error.message}}
        if not self.route(TASK_FAILED, event, failure):
            self.emit(
                ev.RunFailed,
                ev.RunFailedData(state=self.state.state, error=error),
            )


def _error_of(data: Any) -> ev.ErrorInfo:
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return ev.ErrorInfo(error_class="agent_error", message=str(data))
    error_class = str(error.get("class") or "agent_error")
    if error_class not in ev.ERROR_CLASSES:
        error_class = "agent_error"
    return ev.ErrorInfo(
        error_class=error_class,
        message=str(error.get("message", "")),
        retryable=bool(error.get("retryable", False)),
    )


def start(
    definition: Definition,
    *,
    run_id: str,
    inputs: Mapping[str, Any],
    now: str,
    version: int = 1,
    trigger: Incoming | None = None,
    traceparent: str | None = None,
) -> list[ev.AnyRecord]:
    """The first records of a new run: started, then the initial state entered.

    ``inputs`` must already be resolved (see :func:`interlock.core.definition.resolve_inputs`).
    """
    step = _Step(definition, RunState(), now)
    step._run_id = run_id
    step.emit(
        ev.RunStarted,
        ev.RunStartedData(
            workflow=definition.name,
            namespace=definition.namespace,
            version=version,
            spec_hash=definition.spec_hash,
            inputs=dict(inputs),
            context=dict(definition.context),
            trigger=None if trigger is None else trigger.to_dict(),
        ),
        traceparent=traceparent,
    )
    step.enter(definition.initial_state)
    return step.out


def decide(
    definition: Definition, state: RunState, event: Incoming, now: str
) -> list[ev.AnyRecord]:
    """The records an incoming event adds to a run; empty when the run does not take it."""
    if state.status != RUNNING:
        return []
    step = _Step(definition, state, now)
    action_id = event.extensions.get("actionid")
    if action_id is not None:
        pending = state.pending.get(action_id)
        if pending is None:
            return []  # a duplicate, or the answer to an action no longer awaited
        step.action_answered(pending, event)
        return step.out
    if event_key(event.source, event.id) in state.seen:
        return []
    if not definition.states[state.state].transitions_for(event.type):
        return []
    step.emit(ev.EventReceived, ev.EventReceivedData(event=event.to_dict()))
    step.route(event.type, event, None)
    return step.out


def cancel(definition: Definition, state: RunState, *, reason: str, now: str) -> list[ev.AnyRecord]:
    """Cancel a running run (its pending actions are in ``state.pending`` for the shell)."""
    if state.status != RUNNING:
        return []
    step = _Step(definition, state, now)
    step.emit(
        ev.RunCancelled,
        ev.RunCancelledData(
            state=state.state, reason=reason, cancelled_actions=list(state.pending)
        ),
    )
    return step.out
