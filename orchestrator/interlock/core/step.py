"""One decision in the making: the records it emits and the run's state after each.

:class:`Step` holds what every part of deciding shares (emitting a record, the values CEL
sees, timers, cancelling work in flight, failing the run); the layers above it
(:mod:`~interlock.core.transitions`, :mod:`~interlock.core.fanout`,
:mod:`~interlock.core.reactions`) add what a run does. Pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.definition import Definition, RetryPolicy, StateDef
from interlock.core.incoming import Incoming
from interlock.core.pauses import is_pause
from interlock.core.retryafter import retry_after_seconds
from interlock.core.rfc3339 import format_time, parse_time
from interlock.core.state import PendingAction, RunState, evolve
from interlock.core.vocabulary import ERROR_CLASSES, ErrorClass, RunStatus

_ENDS_REQUESTS = frozenset(
    {ev.ActionCompleted, ev.ActionFailed, ev.ActionCancelled, ev.RunCancelled}
)


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


def retry_info(policy: RetryPolicy | None) -> ev.RetryInfo | None:
    if policy is None or policy.max_attempts <= 1:
        return None
    return ev.RetryInfo(
        max_attempts=policy.max_attempts,
        initial_s=policy.initial_s,
        multiplier=policy.multiplier,
        max_s=policy.max_s,
        jitter=policy.jitter,
        errors=list(policy.errors),
    )


STOP_GRACE_S = 30.0
"""How long a cancelled attempt's concurrency slots stay held at most while its worker
stops (``FreedSlots.stopping_until``): a worker that died, or a handler that ignores its
cancellation, holds them no longer."""


def freed(pending: PendingAction, cancelled_at: str | None = None) -> ev.FreedSlots | None:
    """What ending this request frees: its places in its capability's lines. Cancelled
    (at ``cancelled_at``) once dispatched, its concurrency slots are held while its
    worker stops, :data:`STOP_GRACE_S` at most."""
    if not pending.limits:
        return None
    until = None
    if cancelled_at is not None and not pending.held and any(slot_of(c) for c in pending.limits):
        until = plus_seconds(cancelled_at, STOP_GRACE_S)
    return ev.FreedSlots(
        action_id=pending.action_id,
        attempt=pending.attempt,
        limits=pending.limits,
        stopping_until=until,
    )


def slot_of(claim: ev.SlotClaim) -> bool:
    """Whether ``claim`` is a slot of a capability's concurrency limit (not a rate's
    token, nor a pause's line)."""
    return not claim.per_s and not is_pause(claim)


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
class Step:
    """One decision: emits records and keeps the state after each of them."""

    definition: Definition
    state: RunState
    now: str
    out: list[ev.AnyRecord] = field(default_factory=list)
    _run_id: str = ""
    trace: list[GuardCheck] | None = None
    """When given, every guard weighed is reported here (the records are the same)."""
    evidence_before: dict[str, dict[str, Any]] | None = None
    """Deciding on evidence: what the run had proven before it (a held DAG step whose
    gate it changes is checked again, and the check recorded)."""
    regated: set[str] = field(default_factory=set)
    """The held steps checked again in this decision (once each)."""

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
        if cls in _ENDS_REQUESTS:
            data = self._freeing(data)
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

    def _freeing(self, data: Any) -> Any:
        """A record that ends requests names the capability lines they leave (the
        orchestrator frees their slots on it)."""
        pending = self.state.pending
        if isinstance(data, ev.RunCancelledData):
            found = [f for p in pending.values() if (f := freed(p, self.now)) is not None]
            return msgspec.structs.replace(data, freed=found) if found else data
        held = pending.get(data.action_id)
        cancelled = self.now if isinstance(data, ev.ActionCancelledData) else None
        slots = None if held is None else freed(held, cancelled)
        if slots is None:
            return data
        after = data.error.retry_after_s if isinstance(data, ev.ActionFailedData) else None
        if after is not None and any(claim.per_s for claim in slots.limits):
            # The API refused the key: its budget is spent for everyone until then.
            until = plus_seconds(self.now, after)
            slots = msgspec.structs.replace(slots, rate_held_until=until)
        return msgspec.structs.replace(data, freed=slots)

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
        if self.definition.budget.max_cost is not None:
            act["run"]["cost"] = s.cost or 0.0  # only where a cost budget counts it
        if event is not None:
            act["event"] = event.to_dict()
            act["data"] = event.data
        else:
            act["event"] = {}
            act["data"] = None
        if extra:
            act.update(extra)
        return act

    def schedule(self, purpose: str, fire_at: str, **fields: Any) -> None:
        self.emit(
            ev.TimerScheduled,
            ev.TimerScheduledData(
                timer_id=self.next_id, purpose=purpose, fire_at=fire_at, **fields
            ),
        )

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

    def spawns_spent(self) -> int | None:
        """What a run under a spawn allowance reports to its parent when it ends: the
        spawns charged so far (a child run whose end it did not see counts whole)."""
        spawn = self.state.spawn
        return None if spawn is None or spawn.allowance is None else spawn.used

    def fail_run(self, error_class: str, message: str) -> None:
        self.cancel_pending(f"run failed: {error_class}")
        self.emit(
            ev.RunFailed,
            ev.RunFailedData(
                state=self.state.state,
                error=ev.ErrorInfo(error_class=error_class, message=message),
                parent=self.state.parent,
                spawns=self.spawns_spent(),
            ),
        )

    def guard_failed(
        self, state: StateDef, index: int, event_type: str, guard: str, error: str
    ) -> None:
        self.emit(
            ev.GuardFailed,
            ev.GuardFailedData(
                state=state.name, transition=index, event_type=event_type, guard=guard, error=error
            ),
        )


def error_json(error: ev.ErrorInfo) -> dict[str, Any]:
    """A failure as CEL sees it in ``result.error`` (``code`` is "" when none was given)."""
    return {"class": error.error_class, "message": error.message, "code": error.code}


def seconds_text(seconds: float) -> str:
    return f"{seconds:g}s"


def to_text(value: Any) -> str:
    """A rendered value as message text: strings as they are, the rest as JSON."""
    return msgspec.json.encode(value).decode()


def error_of(data: Any, now: str) -> ev.ErrorInfo:
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
        retry_after_s=retry_after_seconds(error.get("retry_after"), now),
    )
