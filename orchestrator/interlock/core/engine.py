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
from datetime import timedelta
from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.definition import (
    ActionDef,
    Definition,
    RetryPolicy,
    StateDef,
    TriggerDef,
)
from interlock.core.expr import ExpressionError, is_literal_true, read_values, render
from interlock.core.rfc3339 import format_time, parse_time
from interlock.core.state import (
    MapProgress,
    PendingAction,
    RunState,
    event_key,
    evolve,
)
from interlock.core.vocabulary import ERROR_CLASSES, RETRYABLE, ErrorClass, RunStatus, TimerPurpose

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

TIMER_FIRED = PREFIX_TIMER = "io.interlock.timer.fired"
"""The type of the incoming event that tells a run one of its timers is due (extension
``timerid``)."""


def plus_seconds(now: str, seconds: float) -> str:
    """``now`` (RFC 3339) plus ``seconds``, as RFC 3339 UTC with milliseconds."""
    return format_time(parse_time(now) + timedelta(seconds=seconds))


def backoff_seconds(retry: ev.RetryInfo, attempt: int, action_id: str) -> float:
    """The wait before attempt ``attempt + 1``: exponential, capped, with a jitter derived
    from the action id (deterministic, so a replay decides the same)."""
    wait = min(retry.initial_s * retry.multiplier ** (attempt - 1), retry.max_s)
    if retry.jitter:
        digest = hashlib.sha256(f"{action_id}#{attempt}".encode()).digest()
        fraction = int.from_bytes(digest[:4], "big") / 2**32
        wait = wait / 2 + wait / 2 * fraction
    return round(wait, 3)


def _retry_info(policy: RetryPolicy | None) -> ev.RetryInfo | None:
    if policy is None or policy.max_attempts <= 1:
        return None
    return ev.RetryInfo(
        max_attempts=policy.max_attempts,
        initial_s=policy.initial_s,
        multiplier=policy.multiplier,
        max_s=policy.max_s,
        jitter=policy.jitter,
    )


@dataclass(frozen=True, slots=True)
class GuardCheck:
    """How one ``on`` entry (or ``catch``) was weighed during a decision; what the explain
    and replay analyses read. Never part of the log.

    ``outcome``: ``fired`` (the entry was taken: its guard gave true, or it has none),
    ``false``, ``error`` (the guard failed to evaluate: fail-closed) or ``not_boolean``.
    """

    state: str
    event_type: str
    transition: int
    """The entry's position among the state's ``on`` entries (-1: a ``catch``)."""
    goto: str
    guard: str | None
    outcome: str
    value: Any = None
    error: str | None = None
    reads: dict[str, Any] = field(default_factory=dict)
    """Each path the guard read (``result.score``) with the value it found."""


@dataclass(slots=True)
class _Step:
    """One decision: emits records and keeps the state after each of them."""

    definition: Definition
    state: RunState
    now: str
    out: list[ev.AnyRecord] = field(default_factory=list)
    _run_id: str = ""
    trace: list[GuardCheck] | None = None
    """When given, every guard weighed is reported here (the records are the same)."""

    def check(self, transition: Any, event_type: str, outcome: str, **fields: Any) -> None:
        if self.trace is None:
            return
        guard = getattr(transition, "guard", None)
        self.trace.append(
            GuardCheck(
                state=self.state.state,
                event_type=event_type,
                transition=getattr(transition, "index", -1),
                goto=transition.goto,
                guard=None if guard is None else guard.source,
                outcome=outcome,
                **fields,
            )
        )

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

    @property
    def next_id(self) -> str:
        return f"{self.state.run_id}:{self.state.seq + 1}"

    @property
    def running(self) -> bool:
        return self.state.status == RunStatus.RUNNING

    @property
    def current(self) -> StateDef:
        return self.definition.states[self.state.state]

    def activation(
        self,
        event: Incoming | None = None,
        result: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
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
        if extra:
            act.update(extra)
        return act

    # -- entering a state and asking for work ------------------------------------------

    def enter(self, name: str) -> None:
        self.emit(ev.StateEntered, ev.StateEnteredData(state=name))
        state = self.current
        if state.terminal:
            self.complete(state)
            return
        if state.timeout is not None:
            self.schedule(
                TimerPurpose.STATE_TIMEOUT,
                plus_seconds(self.now, state.timeout.after_s),
                state=name,
            )
        if state.map is not None:
            self.start_map(state)
        elif state.loop is not None:
            self.request(state.loop.action, 0, iteration=1)
        elif state.actions:
            self.request(state.actions[0], 0)

    def complete(self, state: StateDef) -> None:
        outputs: dict[str, Any] = {}
        act = self.activation()
        for key, value in state.outputs or ():
            try:
                outputs[key] = render(value, act)
            except ExpressionError as exc:
                self.fail_run(
                    ErrorClass.EXPRESSION_ERROR, f"output {key!r} of state {state.name!r}: {exc}"
                )
                return
        if state.fail is not None:
            try:
                message = render(state.fail.message, act)
            except ExpressionError as exc:
                self.fail_run(
                    ErrorClass.EXPRESSION_ERROR, f"fail message of state {state.name!r}: {exc}"
                )
                return
            error = ev.ErrorInfo(
                error_class=state.fail.error_class,
                message=message if isinstance(message, str) else _to_text(message),
            )
            self.emit(
                ev.RunFailed,
                ev.RunFailedData(
                    state=state.name, error=error, outputs=outputs, parent=self.state.parent
                ),
            )
            return
        self.emit(
            ev.RunCompleted,
            ev.RunCompletedData(state=state.name, outputs=outputs, parent=self.state.parent),
        )

    def schedule(self, purpose: str, fire_at: str, **fields: Any) -> None:
        self.emit(
            ev.TimerScheduled,
            ev.TimerScheduledData(
                timer_id=self.next_id, purpose=purpose, fire_at=fire_at, **fields
            ),
        )

    def request(
        self,
        action: ActionDef,
        index: int,
        *,
        attempt: int = 1,
        action_id: str | None = None,
        item: int | None = None,
        iteration: int | None = None,
        retry: ev.RetryInfo | None = None,
    ) -> None:
        state = self.current
        budget = self.definition.budget
        if self.state.actions >= budget.max_actions:
            self.fail_run(
                ErrorClass.BUDGET_EXCEEDED,
                f"more than budget.max_actions ({budget.max_actions}) actions",
            )
            return
        extra: dict[str, Any] = {}
        if item is not None and state.map is not None and self.state.map is not None:
            extra = {"index": item}
            if state.map.item:  # a map's item variable (a parallel state has none)
                extra[state.map.item] = self.state.map.items[item]
        if iteration is not None:
            extra = {"iteration": iteration}
        try:
            payload = render(action.input, self.activation(extra=extra))
        except ExpressionError as exc:
            self.fail_run(
                ErrorClass.EXPRESSION_ERROR,
                f"input of action {index} in state {state.name!r}: {exc}",
            )
            return
        action_id = action_id or self.next_id
        deadline = None if action.timeout_s is None else plus_seconds(self.now, action.timeout_s)
        self.emit(
            ev.ActionRequested,
            ev.ActionRequestedData(
                action_id=action_id,
                state=state.name,
                index=index,
                capability=action.capability,
                input=payload,
                attempt=attempt,
                timeout_s=action.timeout_s,
                deadline=deadline,
                retry=retry if attempt > 1 else _retry_info(action.retry),
                workflow=action.workflow,
                item=item,
                iteration=iteration,
            ),
            # The run's trace context travels with each request, so any replica that
            # dispatches it continues the run's trace.
            traceparent=self.state.traceparent,
        )
        if deadline is not None:
            self.schedule(
                TimerPurpose.ACTION_TIMEOUT,
                deadline,
                state=state.name,
                action_id=action_id,
                attempt=attempt,
                index=index,
                item=item,
                iteration=iteration,
            )

    def action_def(self, index: int, item: int | None) -> ActionDef:
        """The current state's action at ``index`` (its only one for a loop, item ``item``'s
        for a map or a parallel state)."""
        state = self.current
        if state.map is not None:
            return state.map.action_for(item)
        if state.loop is not None:
            return state.loop.action
        return state.actions[index]

    # -- map -----------------------------------------------------------------------------

    def start_map(self, state: StateDef) -> None:
        spec = state.map
        assert spec is not None
        try:
            if spec.over is None:  # a parallel state: one item per branch
                items: Any = list(range(len(spec.branches)))
            else:
                items = spec.over.evaluate(self.activation())
        except ExpressionError as exc:
            self.fail_run(ErrorClass.EXPRESSION_ERROR, f"map over of state {state.name!r}: {exc}")
            return
        if not isinstance(items, list):
            self.fail_run(
                ErrorClass.EXPRESSION_ERROR,
                f"map over of state {state.name!r} gave {type(items).__name__}, not a list",
            )
            return
        fan_out = self.definition.budget.max_fan_out
        if len(items) > fan_out:
            self.failed(
                ev.ErrorInfo(
                    error_class=ErrorClass.BUDGET_EXCEEDED,
                    message=f"map over {len(items)} items is above budget.max_fan_out ({fan_out})",
                ),
                None,
            )
            return
        self.emit(
            ev.MapStarted,
            ev.MapStartedData(
                state=state.name,
                items=items,
                parallelism=spec.parallelism,
                completion=spec.completion,
            ),
        )
        if not items:
            self.finish_map(state, [])
            return
        self.fill_map(state)

    def fill_map(self, state: StateDef) -> None:
        """Request items until ``parallelism`` are in flight or none are left."""
        spec = state.map
        assert spec is not None
        while self.running and self.state.map is not None:
            progress = self.state.map
            # An item waiting for its retry is still in flight.
            waiting = sum(
                1
                for t in self.state.timers.values()
                if t.purpose == TimerPurpose.RETRY and t.item is not None
            )
            busy = len(self.state.pending) + waiting
            if progress.next >= len(progress.items) or busy >= spec.parallelism:
                return
            self.request(spec.action_for(progress.next), 0, item=progress.next)

    def finish_map(self, state: StateDef, result: Any) -> None:
        self.emit(ev.MapCompleted, ev.MapCompletedData(state=state.name, result=result))
        self.route(TASK_COMPLETED, None, result)

    def map_item_done(self, state: StateDef) -> None:
        """After an item succeeded or finally failed: finish, fail or request more."""
        progress = self.state.map
        assert progress is not None
        assert state.map is not None
        total = len(progress.items)
        # How failures name what failed: an item of a map, or an action of a parallel state.
        item, whole = ("action", "parallel") if state.map.branches else ("item", "map")
        if progress.completion == "any":
            winners = sorted(progress.results)
            if winners:
                self.cancel_pending(f"{whole} completed (any)")
                self.finish_map(state, progress.results[winners[0]])
                return
            if len(progress.failed) == total:
                last = progress.failed[max(progress.failed)]
                self.failed(
                    ev.ErrorInfo(
                        error_class=last.error_class,
                        message=(
                            f"every {item} of {whole} {state.name!r} failed; last: {last.message}"
                        ),
                    ),
                    None,
                )
                return
        elif progress.completion == "all_settled":
            if len(progress.results) + len(progress.failed) == total:
                self.finish_map(state, [_settled(progress, i) for i in range(total)])
                return
        else:
            if progress.failed:
                first = min(progress.failed)
                self.cancel_pending(f"{whole} failed fast")
                error = progress.failed[first]
                self.failed(
                    ev.ErrorInfo(
                        error_class=error.error_class,
                        message=f"{item} {first} of {whole} {state.name!r} failed: {error.message}",
                    ),
                    None,
                )
                return
            if len(progress.results) == total:
                self.finish_map(state, [progress.results[i] for i in range(total)])
                return
        self.fill_map(state)

    # -- leaving a state -----------------------------------------------------------------

    def cancel_pending(self, reason: str) -> None:
        """Cancel every action in flight (their agents are told by the shell)."""
        for pending in list(self.state.pending.values()):
            self.emit(
                ev.ActionCancelled,
                ev.ActionCancelledData(
                    action_id=pending.action_id,
                    state=pending.state,
                    reason=reason,
                    workflow=pending.workflow,
                ),
            )

    def fail_run(self, error_class: str, message: str) -> None:
        self.cancel_pending(f"run failed: {error_class}")
        self.emit(
            ev.RunFailed,
            ev.RunFailedData(
                state=self.state.state,
                error=ev.ErrorInfo(error_class=error_class, message=message),
                parent=self.state.parent,
            ),
        )

    def move(
        self,
        to: str,
        event_type: str,
        event: Incoming | None,
        index: int,
        sets: tuple[tuple[str, Any], ...],
        act: dict[str, Any],
    ) -> None:
        budget = self.definition.budget
        if self.state.transitions >= budget.max_transitions:
            self.fail_run(
                ErrorClass.BUDGET_EXCEEDED,
                f"more than budget.max_transitions ({budget.max_transitions}) transitions",
            )
            return
        writes: dict[str, Any] = {}
        for key, value_def in sets:
            try:
                writes[key] = render(value_def, act)
            except ExpressionError as exc:
                self.fail_run(ErrorClass.EXPRESSION_ERROR, f"set {key!r} on {event_type}: {exc}")
                return
        self.cancel_pending(f"left state {self.state.state!r} on {event_type}")
        self.emit(
            ev.TransitionFired,
            ev.TransitionFiredData(
                from_state=self.state.state,
                to_state=to,
                event_type=event_type,
                event_id=None if event is None else event.id,
                transition=index,
                set=writes,
            ),
        )
        self.enter(to)

    def route(self, event_type: str, event: Incoming | None, result: Any = None) -> bool:
        """Fire the first transition of the current state that the event takes."""
        state = self.current
        candidates = state.transitions_for(event_type)
        if not candidates:
            return False
        act = self.activation(event, result)
        for t in candidates:
            if t.guard is not None:
                reads = {} if self.trace is None else read_values(t.guard, act)
                try:
                    value = t.guard.evaluate(act)
                except ExpressionError as exc:
                    self.check(t, event_type, "error", error=str(exc), reads=reads)
                    self._guard_failed(state, t.index, event_type, t.guard.source, str(exc))
                    continue
                if not is_literal_true(value):
                    outcome = "false" if value is False else "not_boolean"
                    self.check(t, event_type, outcome, value=value, reads=reads)
                    if not isinstance(value, bool):
                        self._guard_failed(
                            state,
                            t.index,
                            event_type,
                            t.guard.source,
                            f"guard gave {type(value).__name__} {value!r}, not a boolean",
                        )
                    continue
                self.check(t, event_type, "fired", value=value, reads=reads)
            else:
                self.check(t, event_type, "fired")
            self.move(t.goto, event_type, event, t.index, t.set, act)
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

    def failed(self, error: ev.ErrorInfo, event: Incoming | None) -> None:
        """A state's work failed for good: ``on: task.failed``, then ``catch``, else the run."""
        failure = {"error": _error_json(error)}
        if self.route(TASK_FAILED, event, failure):
            return
        for catch in self.current.catches:
            if catch.matches(error.error_class, error.code):
                reads = {"result.error.class": error.error_class}
                if catch.codes:
                    reads["result.error.code"] = error.code
                self.check(catch, TASK_FAILED, "fired", reads=reads)
                self.move(
                    catch.goto, TASK_FAILED, event, -1, catch.set, self.activation(event, failure)
                )
                return
        self.cancel_pending(f"run failed: {error.error_class}")
        self.emit(
            ev.RunFailed,
            ev.RunFailedData(state=self.state.state, error=error, parent=self.state.parent),
        )

    # -- answers from agents and timers --------------------------------------------------

    def action_answered(self, pending: PendingAction, event: Incoming) -> None:
        if event.type == TASK_FAILED:
            self.action_failed(pending, _error_of(event.data), event)
            return
        action = self.action_def(pending.index, pending.item)
        result = event.data
        writes: dict[str, Any] = {}
        if isinstance(result, dict) and pending.item is None:
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
                item=pending.item,
                iteration=pending.iteration,
                source=event.source,
            ),
        )
        state = self.current
        if pending.item is not None and state.map is not None:
            self.map_item_done(state)
            return
        if pending.iteration is not None and state.loop is not None:
            self.loop_step(state, pending, result, event)
            return
        if event.type != TASK_COMPLETED and self.route(event.type, event, result):
            return
        if pending.index + 1 < len(state.actions):
            self.request(state.actions[pending.index + 1], pending.index + 1)
            return
        self.route(TASK_COMPLETED, event, result)

    def loop_step(
        self, state: StateDef, pending: PendingAction, result: Any, event: Incoming
    ) -> None:
        loop = state.loop
        assert loop is not None
        assert pending.iteration is not None
        act = self.activation(event, result, {"iteration": pending.iteration})
        try:
            done = loop.until.evaluate(act)
        except ExpressionError as exc:
            self._guard_failed(state, -1, "loop.until", loop.until.source, str(exc))
            done = False
        if is_literal_true(done):
            self.route(TASK_COMPLETED, event, result)
            return
        if pending.iteration >= loop.max_iterations:
            self.failed(
                ev.ErrorInfo(
                    error_class=ErrorClass.BUDGET_EXCEEDED,
                    message=f"loop {state.name!r} did not finish in "
                    f"max_iterations ({loop.max_iterations})",
                ),
                event,
            )
            return
        self.request(loop.action, 0, iteration=pending.iteration + 1)

    def action_failed(
        self, pending: PendingAction, error: ev.ErrorInfo, event: Incoming | None
    ) -> None:
        retry = pending.retry
        will_retry = (
            retry is not None
            and pending.attempt < retry.max_attempts
            and (error.retryable or error.error_class in RETRYABLE)
        )
        self.emit(
            ev.ActionFailed,
            ev.ActionFailedData(
                action_id=pending.action_id,
                state=pending.state,
                index=pending.index,
                error=error,
                attempt=pending.attempt,
                event_id=None if event is None else event.id,
                item=pending.item,
                iteration=pending.iteration,
                will_retry=will_retry,
                source=None if event is None else event.source,
            ),
        )
        if will_retry:
            assert retry is not None
            wait = backoff_seconds(retry, pending.attempt, pending.action_id)
            self.schedule(
                TimerPurpose.RETRY,
                plus_seconds(self.now, wait),
                state=pending.state,
                action_id=pending.action_id,
                attempt=pending.attempt + 1,
                index=pending.index,
                item=pending.item,
                iteration=pending.iteration,
                retry=retry,
            )
            return
        state = self.current
        if pending.item is not None and state.map is not None:
            self.map_item_done(state)
            return
        self.failed(error, event)

    def timer_fired(self, timer: ev.TimerScheduledData) -> None:
        self.emit(ev.TimerFired, ev.TimerFiredData(timer_id=timer.timer_id, purpose=timer.purpose))
        state = self.current
        if timer.purpose == TimerPurpose.RUN_DEADLINE:
            deadline = self.definition.deadline
            if deadline is None:
                return
            if deadline.goto is None:
                self.fail_run(
                    ErrorClass.TIMEOUT,
                    f"the run did not finish within {_seconds(deadline.after_s)}",
                )
            else:
                self.move(deadline.goto, "run.deadline", None, -1, deadline.set, self.activation())
            return
        if timer.purpose == TimerPurpose.STATE_TIMEOUT:
            if state.timeout is not None:
                self.move(
                    state.timeout.goto,
                    "state.timeout",
                    None,
                    -1,
                    state.timeout.set,
                    self.activation(),
                )
            return
        if timer.purpose == TimerPurpose.ACTION_TIMEOUT:
            pending = self.state.pending.get(timer.action_id or "")
            if pending is None or pending.attempt != timer.attempt:
                return
            seconds = "" if pending.deadline is None else f" (deadline {pending.deadline})"
            self.action_failed(
                pending,
                ev.ErrorInfo(
                    error_class=ErrorClass.TIMEOUT,
                    message=f"no answer from {pending.capability or pending.workflow}{seconds}",
                    retryable=True,
                ),
                None,
            )
            return
        if timer.purpose == TimerPurpose.RETRY:
            self.request(
                self.action_def(timer.index, timer.item),
                timer.index,
                attempt=timer.attempt,
                action_id=timer.action_id,
                item=timer.item,
                iteration=timer.iteration,
                retry=timer.retry,
            )


def _settled(progress: MapProgress, index: int) -> dict[str, Any]:
    """How one item of an ``all_settled`` map ended: its result, or its error."""
    if index in progress.results:
        return {"status": "completed", "result": progress.results[index]}
    error = progress.failed[index]
    return {"status": "failed", "error": _error_json(error)}


def _error_json(error: ev.ErrorInfo) -> dict[str, Any]:
    """A failure as CEL sees it in ``result.error`` (``code`` is "" when none was given)."""
    return {"class": error.error_class, "message": error.message, "code": error.code}


def _seconds(seconds: float) -> str:
    return f"{seconds:g}s"


def _to_text(value: Any) -> str:
    """A rendered value as message text: strings as they are, the rest as JSON."""
    return msgspec.json.encode(value).decode()


def _error_of(data: Any) -> ev.ErrorInfo:
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return ev.ErrorInfo(error_class=ErrorClass.AGENT_ERROR, message=str(data))
    error_class = str(error.get("class") or ErrorClass.AGENT_ERROR)
    code = str(error.get("code") or "")
    if error_class not in ERROR_CLASSES:
        # An agent's own class is kept as the code, so a guard can still tell it apart.
        error_class, code = ErrorClass.AGENT_ERROR, code or error_class
    return ev.ErrorInfo(
        error_class=error_class,
        message=str(error.get("message", "")),
        retryable=bool(error.get("retryable", False)),
        code=code,
    )


def correlation_key(definition: Definition, inputs: Mapping[str, Any]) -> str | None:
    """The key a run of ``definition`` with ``inputs`` is correlated by (None: none)."""
    if definition.correlation is None:
        return None
    try:
        value = render(definition.correlation.key, {"inputs": dict(inputs), "context": {}})
    except ExpressionError:
        return None
    return None if value is None else str(value)


def event_correlation_key(definition: Definition, event: Incoming) -> str | None:
    """The correlation key an event carries for ``definition`` (None: it carries none)."""
    if definition.correlation is None:
        return None
    expression = definition.correlation.events.get(event.type)
    if expression is None:
        return None
    try:
        value = expression.evaluate({"event": event.to_dict(), "data": event.data})
    except ExpressionError:
        return None
    return None if value is None else str(value)


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
    trace: list[GuardCheck] | None = None,
) -> list[ev.AnyRecord]:
    """The first records of a new run: started, then the initial state entered.

    ``inputs`` must already be resolved (see :func:`interlock.core.definition.resolve_inputs`).
    ``trace``, when given, receives every guard weighed (it changes no record).
    """
    step = _Step(definition, RunState(), now, trace=trace)
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
            correlation_key=correlation_key(definition, inputs),
            parent=parent,
        ),
        traceparent=traceparent,
    )
    if definition.deadline is not None:
        step.schedule(TimerPurpose.RUN_DEADLINE, plus_seconds(now, definition.deadline.after_s))
    step.enter(definition.initial_state)
    return step.out


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
    if state.status != RunStatus.RUNNING:
        return []
    step = _Step(definition, state, now, trace=trace)
    if event.type == TIMER_FIRED:
        timer = state.timers.get(event.extensions.get("timerid", ""))
        if timer is None:
            return []  # already fired, or belonged to a state the run has left
        step.timer_fired(timer)
        return step.out
    action_id = event.extensions.get("actionid")
    if action_id is not None:
        pending = state.pending.get(action_id)
        if pending is None:
            return []  # a duplicate, or the answer to an action no longer awaited
        attempt = event.extensions.get("attempt")
        if attempt is not None and attempt.isdigit() and int(attempt) != pending.attempt:
            return []  # the answer to an earlier attempt that timed out
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
    if state.status != RunStatus.RUNNING:
        return []
    step = _Step(definition, state, now)
    step.emit(
        ev.RunCancelled,
        ev.RunCancelledData(
            state=state.state,
            reason=reason,
            cancelled_actions=list(state.pending),
            parent=state.parent,
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
) -> list[ev.AnyRecord]:
    """The records that turn a copied log prefix into a run of its own: the fork marker,
    then the state the run was in entered again under ``definition``, so its work is asked
    for afresh (with fresh deadlines and inputs rendered by this definition)."""
    if state.status != RunStatus.RUNNING:
        return []
    step = _Step(definition, state, now)
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
    step.enter(state.state)
    return step.out


def migrate(
    definition: Definition, state: RunState, *, version: int, now: str
) -> list[ev.AnyRecord]:
    """The record that moves a running run onto another version of its workflow."""
    if state.status != RunStatus.RUNNING:
        return []
    step = _Step(definition, state, now)
    step.emit(
        ev.RunMigrated,
        ev.RunMigratedData(
            from_version=state.version,
            from_spec_hash=state.spec_hash,
            version=version,
            spec_hash=definition.spec_hash,
            checked_through=state.seq,
        ),
    )
    return step.out
