"""Entering states, asking for their work, and leaving them: the transitions of a run.

Pure; :class:`Transitions` adds to :class:`~interlock.core.step.Step` what every kind of
state does. A state's first work is asked for by :meth:`Transitions.start_work`, which the
layers above extend with the kinds of state they know (a map, a parallel state).
"""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.capacity import claims
from interlock.core.continuing import continued_run_id, deadline_at
from interlock.core.definition import ActionDef, ContinueDef, StateDef, resolve_inputs
from interlock.core.expr import ExpressionError, is_literal_true, read_values, render
from interlock.core.history import TRANSITION, continues_by_itself
from interlock.core.incoming import Incoming
from interlock.core.state import PendingAction
from interlock.core.step import Step, error_json, plus_seconds, retry_info, to_text
from interlock.core.vocabulary import TASK_FAILED, ErrorClass, StepStatus, TimerPurpose


class Transitions(Step):
    """A decision that can enter, leave and route between states."""

    __slots__ = ()

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
        self.start_work(state)

    def start_work(self, state: StateDef) -> None:
        """Ask for a state's first work: its loop's first iteration or its first action."""
        if state.loop is not None:
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
                message=message if isinstance(message, str) else to_text(message),
            )
            self.emit(
                ev.RunFailed,
                ev.RunFailedData(
                    state=state.name,
                    error=error,
                    outputs=outputs,
                    parent=self.state.parent,
                    spawns=self.spawns_spent(),
                ),
            )
            return
        self.emit(
            ev.RunCompleted,
            ev.RunCompletedData(
                state=state.name,
                outputs=outputs,
                parent=self.state.parent,
                spawns=self.spawns_spent(),
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
        step: str | None = None,
    ) -> bool:
        """Ask for an action; False when not (the run failed, or a spawn budget refused
        it and its failure is decided on already: the caller must not go on)."""
        state = self.current
        budget = self.definition.budget
        if self.state.actions >= budget.max_actions:
            self.fail_run(
                ErrorClass.BUDGET_EXCEEDED,
                f"more than budget.max_actions ({budget.max_actions}) actions",
            )
            return False
        try:
            payload = render(action.input, self.activation(extra=self.variables(item, iteration)))
        except ExpressionError as exc:
            self.fail_run(
                ErrorClass.EXPRESSION_ERROR,
                f"input of action {index} in state {state.name!r}: {exc}",
            )
            return False
        limits, problem = claims(
            action, payload, self.activation(extra=self.variables(item, iteration))
        )
        if problem is not None:
            self.fail_run(ErrorClass.SCHEMA_ERROR, problem)
            return False
        action_id = action_id or self.next_id
        # A request held for its capability's limits has no deadline until admitted.
        timeout = None if limits else action.timeout_s
        deadline = None if timeout is None else plus_seconds(self.now, timeout)
        data = ev.ActionRequestedData(
            action_id=action_id,
            state=state.name,
            index=index,
            capability=action.capability,
            input=payload,
            attempt=attempt,
            timeout_s=action.timeout_s,
            deadline=deadline,
            retry=retry if attempt > 1 else retry_info(action.retry),
            workflow=action.workflow,
            item=item,
            iteration=iteration,
            step=step,
            spawn=None if action.workflow is None else self.handed_down(item, step),
            limits=limits,
        )
        if self.spawn_refused(data):
            return False
        # The run's trace context travels with each request, so any replica that
        # dispatches it continues the run's trace.
        self.emit(ev.ActionRequested, data, traceparent=self.state.traceparent)
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
                step=step,
            )
        return True

    def spawn_refused(self, d: ev.ActionRequestedData) -> bool:
        """Whether the run's spawn budgets refuse the action about to be asked for: then
        it is not asked for, and fails as if it had been (routed like any failure)."""
        refusal = None if self.state.spawn is None else self.state.spawn.refusal()
        if refusal is None:
            return False
        would_be = PendingAction(
            action_id=d.action_id,
            state=d.state,
            index=d.index,
            capability=d.capability,
            attempt=d.attempt,
            retry=d.retry,
            workflow=d.workflow,
            item=d.item,
            iteration=d.iteration,
            step=d.step,
        )
        self.action_failed(would_be, refusal, None)
        return True

    def handed_down(self, item: int | None, step: str | None) -> ev.SpawnBudget:
        """What a ``workflow`` action hands its child run (see :mod:`spawn`): for a map's
        item or a DAG's step, an even share with the items or steps not yet asked for."""
        spawn = self.state.spawn
        if spawn is None:
            return ev.SpawnBudget(depth=1)
        progress, dag = self.state.map, self.state.dag
        sharing = 1
        if item is not None and progress is not None:
            sharing += max(0, len(progress.items) - max(progress.next, item + 1))
        elif step is not None and dag is not None:
            held = StepStatus.HELD
            sharing += sum(1 for s in dag.steps if s != step and dag.status.get(s, held) == held)
        return spawn.handed_down(sharing)

    def action_failed(
        self, pending: PendingAction, error: ev.ErrorInfo, event: Incoming | None
    ) -> None:
        """An action failed (with a retry to come, or for good); decided by the layer that
        knows every kind of state."""
        raise NotImplementedError

    def variables(self, item: int | None, iteration: int | None) -> dict[str, Any]:
        """What an action's input may read besides the run's own values: a map item and
        its index, or a loop's iteration (a layer above adds a DAG's steps)."""
        state = self.current
        if item is not None and state.map is not None and self.state.map is not None:
            extra: dict[str, Any] = {"index": item}
            if state.map.item:  # a map's item variable (a parallel state has none)
                extra[state.map.item] = self.state.map.items[item]
            return extra
        if iteration is not None:
            return {"iteration": iteration}
        return {}

    def action_def(self, index: int, item: int | None, step: str | None = None) -> ActionDef:
        """The current state's action at ``index`` (its only one for a loop, item ``item``'s
        for a map or a parallel state, step ``step``'s for a DAG)."""
        state = self.current
        if state.dag is not None and step is not None:
            return state.dag.step(step).action
        if state.map is not None:
            return state.map.action_for(item)
        if state.loop is not None:
            return state.loop.action
        return state.actions[index]

    # -- leaving a state -----------------------------------------------------------------

    def move(
        self,
        to: str,
        event_type: str,
        event: Incoming | None,
        index: int,
        sets: tuple[tuple[str, Any], ...],
        act: dict[str, Any],
        budgets: tuple[str, ...] = (),
        guard_errors: tuple[int, ...] = (),
        renew: ContinueDef | None = None,
    ) -> None:
        budget = self.definition.budget
        spent = self.state.spent or {}
        for name in budgets:
            limit = budget.edges.get(name, 0)
            if spent.get(name, 0) >= limit:
                self.fail_run(
                    ErrorClass.BUDGET_EXCEEDED,
                    f"more than budget.edges.{name} ({limit}) transitions: "
                    f"{self.state.state} -> {to} on {event_type}",
                )
                return
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
        inputs: dict[str, Any] | None = None
        reason = None
        if renew is not None:
            inputs = self.renewed_inputs(renew, act, event_type)
            if inputs is None:
                return
            reason = TRANSITION
        elif not self.definition.states[to].terminal:
            reason = continues_by_itself(self.state)
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
                budget=list(budgets),
                guard_errors=list(guard_errors),
            ),
        )
        if reason is not None:
            self.continue_as_new(to, reason, self.state.inputs if inputs is None else inputs)
            return
        self.enter(to)

    def renewed_inputs(
        self, renew: ContinueDef, act: dict[str, Any], event_type: str
    ) -> dict[str, Any] | None:
        """The inputs of the run a ``continue_as_new`` transition starts: the run's, with
        the ones it gives rendered over them and checked; None when the run failed."""
        given = dict(self.state.inputs)
        for key, value_def in renew.inputs:
            try:
                given[key] = render(value_def, act)
            except ExpressionError as exc:
                self.fail_run(
                    ErrorClass.EXPRESSION_ERROR,
                    f"continue_as_new input {key!r} on {event_type}: {exc}",
                )
                return None
        inputs, problems = resolve_inputs(self.definition, given)
        if problems:
            self.fail_run(
                ErrorClass.SCHEMA_ERROR,
                f"continue_as_new inputs on {event_type}: " + "; ".join(problems),
            )
            return None
        return inputs

    def continue_as_new(self, to: str, reason: str, inputs: dict[str, Any]) -> None:
        """End the run's log: it goes on as a new run that enters ``to`` (started by the
        shell, from this record)."""
        seq = self.state.seq + 1
        self.emit(
            ev.RunContinued,
            ev.RunContinuedData(
                run_id=continued_run_id(self.state.run_id, seq),
                state=to,
                inputs=inputs,
                reason=reason,
                records=seq,
                deadline_at=deadline_at(self.state),
                parent=self.state.parent,
            ),
        )

    def route(self, event_type: str, event: Incoming | None, result: Any = None) -> bool:
        """Fire the first transition of the current state that the event takes."""
        state = self.current
        candidates = state.transitions_for(event_type)
        if not candidates:
            return False
        act = self.activation(event, result)
        errored: list[int] = []
        for t in candidates:
            if t.guard is not None:
                reads = {} if self.trace is None else read_values(t.guard, act)
                try:
                    value = t.guard.evaluate(act)
                except ExpressionError as exc:
                    self.check(t, event_type, "error", error=str(exc), reads=reads)
                    self.guard_failed(state, t.index, event_type, t.guard.source, str(exc))
                    errored.append(t.index)
                    continue
                if not is_literal_true(value):
                    outcome = "false" if value is False else "not_boolean"
                    self.check(t, event_type, outcome, value=value, reads=reads)
                    if not isinstance(value, bool):
                        self.guard_failed(
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
            # A guard before it that failed to evaluate did not fire (fail-closed): the
            # transition taken says so, the branch was decided by that error.
            self.move(
                t.goto,
                event_type,
                event,
                t.index,
                t.set,
                act,
                t.budget,
                guard_errors=tuple(errored),
                renew=t.renew,
            )
            return True
        return False

    def failed(self, error: ev.ErrorInfo, event: Incoming | None) -> None:
        """A state's work failed for good: ``on: task.failed``, then ``catch``, else the run."""
        failure = {"error": error_json(error)}
        if self.route(TASK_FAILED, event, failure):
            return
        for catch in self.current.catches:
            if catch.matches(error.error_class, error.code):
                reads = {"result.error.class": error.error_class}
                if catch.codes:
                    reads["result.error.code"] = error.code
                self.check(catch, TASK_FAILED, "fired", reads=reads)
                self.move(
                    catch.goto,
                    TASK_FAILED,
                    event,
                    -1,
                    catch.set,
                    self.activation(event, failure),
                    catch.budget,
                )
                return
        self.cancel_pending(f"run failed: {error.error_class}")
        self.emit(
            ev.RunFailed,
            ev.RunFailedData(
                state=self.state.state,
                error=error,
                parent=self.state.parent,
                spawns=self.spawns_spent(),
            ),
        )
