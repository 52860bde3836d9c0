"""How a run reacts to what arrives: an agent's answer, a failure, a due timer. Pure."""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.dag import Dag
from interlock.core.definition import StateDef, StateGateDef
from interlock.core.expr import ExpressionError, is_literal_true
from interlock.core.incoming import SPAWNS_EXTENSION, Incoming
from interlock.core.rfc3339 import parse_time
from interlock.core.state import PendingAction
from interlock.core.step import backoff_seconds, error_of, plus_seconds, seconds_text
from interlock.core.vocabulary import (
    RETRYABLE,
    TASK_COMPLETED,
    TASK_FAILED,
    ErrorClass,
    TimerPurpose,
)


class Reactions(Dag):
    """The whole decision: every kind of state, and what each arrival does to it."""

    __slots__ = ()

    def action_answered(self, pending: PendingAction, event: Incoming) -> None:
        if event.type == TASK_FAILED:
            self.action_failed(pending, error_of(event.data, self.now), event)
            return
        action = self.action_def(pending.index, pending.item, pending.step)
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
                step=pending.step,
                # Only a workflow with a cost budget counts costs: others write as before.
                cost=None if self.definition.budget.max_cost is None else _cost(result),
                spawns=_spawns(pending, event),
            ),
        )
        if self.over_cost_budget(event):
            return
        state = self.current
        if pending.item is not None and state.map is not None:
            self.map_item_done(state)
            return
        if pending.step is not None and state.dag is not None:
            self.advance_dag(state, state.dag)
            return
        if pending.iteration is not None and state.loop is not None:
            self.loop_step(state, pending, result, event)
            return
        if event.type != TASK_COMPLETED and self.route(event.type, event, result):
            return
        if pending.index + 1 < len(state.actions):
            self.request(state.actions[pending.index + 1], pending.index + 1)
            return
        if state.gate is not None and self.refused(state, state.gate, pending, event, result):
            return
        self.route(TASK_COMPLETED, event, result)

    def refused(
        self,
        state: StateDef,
        gate: StateGateDef,
        pending: PendingAction,
        event: Incoming,
        result: Any,
    ) -> bool:
        """Check the state's evidence gate on the answer that completes its actions (when
        ``when`` holds; a ``when`` that errors checks it: fail-closed). Not proven: the
        answer is refused and the action asked again at the same attempt, so a refusal
        costs no attempt (each request still counts against ``budget.max_actions``)."""
        missing = self.gate_missing(state, gate, self.activation(event, result), pending.action_id)
        if not missing:
            return False
        self.request(
            self.action_def(pending.index, None),
            pending.index,
            attempt=pending.attempt,
            retry=pending.retry,
        )
        return True

    def event_refused(self, state: StateDef, gate: StateGateDef, event: Incoming) -> bool:
        """Check the gate of a state without actions on the external event it is about to
        take (when ``when`` holds). Not proven: the event is not taken, and the state goes
        on waiting."""
        return bool(self.gate_missing(state, gate, self.activation(event, None), ""))

    def gate_missing(
        self, state: StateDef, gate: StateGateDef, act: dict[str, Any], action_id: str
    ) -> list[str]:
        """What the gate misses (recorded as ``gate.checked``); empty when it is proven or
        ``when`` says it does not apply."""
        if gate.when is not None:
            try:
                applies = gate.when.evaluate(act)
            except ExpressionError as exc:
                self.guard_failed(state, -1, "gate.when", gate.when.source, str(exc))
                applies = True
            if applies is not True:
                return []
        subject = gate.gate.subject
        proofs = dict((self.state.evidence or {}).get(subject, {}))
        for expression in gate.evidence:
            try:
                value = expression.evaluate(act)
            except ExpressionError as exc:  # proves nothing
                self.guard_failed(state, -1, "gate.evidence", expression.source, str(exc))
                continue
            if isinstance(value, dict):
                proofs.update({str(k): v for k, v in value.items()})
        missing = gate.gate.missing({subject: proofs})
        self.emit(
            ev.GateChecked,
            ev.GateCheckedData(
                state=state.name,
                subject=subject,
                proven=not missing,
                missing=missing,
                action_id=action_id,
            ),
        )
        return missing

    def over_cost_budget(self, event: Incoming) -> bool:
        """Whether the answer just recorded took the run over ``budget.max_cost``: then its
        state fails with ``budget_exceeded`` (code ``max_cost``), routed like any failure."""
        limit = self.definition.budget.max_cost
        spent = self.state.cost
        if limit is None or spent is None or spent <= limit:
            return False
        self.cancel_pending(f"budget.max_cost ({limit:g}) exceeded")
        self.failed(
            ev.ErrorInfo(
                error_class=ErrorClass.BUDGET_EXCEEDED,
                message=f"spent {spent:g}, more than budget.max_cost ({limit:g})",
                code="max_cost",
            ),
            event,
        )
        return True

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
            self.guard_failed(state, -1, "loop.until", loop.until.source, str(exc))
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
            and (
                error.retryable
                or error.error_class in RETRYABLE
                or "*" in retry.errors
                or error.error_class in retry.errors
            )
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
                step=pending.step,
                spawns=None if event is None else _spawns(pending, event),
            ),
        )
        if will_retry:
            assert retry is not None
            backoff = backoff_seconds(retry, pending.attempt, pending.action_id)
            after = error.retry_after_s
            self.schedule(
                TimerPurpose.RETRY,
                plus_seconds(self.now, max(backoff, after or 0.0)),
                state=pending.state,
                action_id=pending.action_id,
                attempt=pending.attempt + 1,
                index=pending.index,
                item=pending.item,
                iteration=pending.iteration,
                retry=retry,
                step=pending.step,
                backoff_s=None if after is None else backoff,
                retry_after_s=after,
            )
            return
        state = self.current
        if pending.item is not None and state.map is not None:
            self.map_item_done(state)
            return
        if pending.step is not None and state.dag is not None:
            self.dag_step_failed(state, pending.step, error)
            return
        self.failed(error, event)

    def timer_fired(self, timer: ev.TimerScheduledData) -> None:
        self.emit(ev.TimerFired, ev.TimerFiredData(timer_id=timer.timer_id, purpose=timer.purpose))
        state = self.current
        if timer.purpose == TimerPurpose.RUN_DEADLINE:
            started = parse_time(self.state.started_at)
            self.deadline_passed((parse_time(timer.fire_at) - started).total_seconds())
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
            if pending.held or pending.deadline != timer.fire_at:
                return  # held for its capability since: its deadline runs from admission
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
                self.action_def(timer.index, timer.item, timer.step),
                timer.index,
                attempt=timer.attempt,
                action_id=timer.action_id,
                item=timer.item,
                iteration=timer.iteration,
                retry=timer.retry,
                step=timer.step,
            )

    def deadline_passed(self, seconds: float) -> None:
        """The run's deadline (``seconds`` after its start) has come: it moves to the
        deadline's ``goto`` (its ``set`` may read a DAG's ``steps`` as they stand), or
        fails with timeout."""
        deadline = self.definition.deadline
        if deadline is None or deadline.goto is None:
            self.fail_run(
                ErrorClass.TIMEOUT, f"the run did not finish within {seconds_text(seconds)}"
            )
            return
        dag = self.state.dag
        steps = {"steps": dag.view() if dag is not None else {}}
        act = self.activation(extra=steps)
        self.move(deadline.goto, "run.deadline", None, -1, deadline.set, act)


def _spawns(pending: PendingAction, event: Incoming) -> int | None:
    """What a child run reports it spent of its spawn allowance (extension ``spawns`` of
    its end, which only the orchestrator answers a ``workflow`` action with)."""
    if pending.workflow is None:
        return None
    value = event.extensions.get(SPAWNS_EXTENSION, "")
    return int(value) if value.isdigit() and len(value) < 10 else None


def _cost(result: Any) -> float | None:
    """The cost an answer reports: its result's ``cost``, when a number of zero or more.
    A run's total is what every agent answering it reported, so a negative one would have
    let one agent lower what the others spent and keep ``budget.max_cost`` from binding
    them: it is no cost reported."""
    if isinstance(result, dict):
        cost = result.get("cost")
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            return float(cost)
    return None
