"""The telemetry view of a run: what the metrics and the traces know of a run before each
of its records is reported (its workflow, the state it is in, its actions in flight), and
how each kind of record changes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time as parse_rfc3339
from interlock.core.vocabulary import RunStatus


def epoch_seconds(text: str) -> float:
    """Seconds since the epoch of a record's RFC 3339 ``time`` (0.0 when unreadable)."""
    try:
        return parse_rfc3339(text).timestamp()
    except ValueError:
        return 0.0


def record_seq(record: ev.Record) -> int:
    """A record's position in its run's log, from its id (``<run id>:<seq>``)."""
    try:
        return int(record.id.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


@dataclass(slots=True)
class Visit:
    """One stay of a run in a state: from its ``state.entered`` record until it leaves."""

    state: str
    seq: int
    """Log position of the ``state.entered`` record (names the visit)."""
    entered_at: str
    notes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(time, name, attributes) of what happened during the visit: events, guard failures."""


@dataclass(slots=True)
class PendingView:
    action_id: str
    capability: str
    index: int
    attempt: int
    requested_at: str
    visit_seq: int


@dataclass(slots=True)
class RunView:
    """What telemetry knows about a run before the record being reported is applied."""

    run_id: str
    workflow: str = ""
    namespace: str = "default"
    version: int = 0
    traceparent: str | None = None
    started_at: str = ""
    seq: int = 0
    stream_seq: int = 0
    visit: Visit | None = None
    pending: dict[str, PendingView] = field(default_factory=dict)
    status: str = RunStatus.RUNNING

    @property
    def finished(self) -> bool:
        return self.status != RunStatus.RUNNING

    def apply(self, record: ev.AnyRecord, seq: int | None = None) -> None:
        at = record_seq(record) if seq is None else seq  # seq: its position, if known
        if at > self.seq:
            self.seq = at
        change = VIEW_CHANGES.get(type(record))
        if change is not None:
            change(self, record, at)


def action_target(data: ev.ActionRequestedData) -> str:
    """What an action asks for: its capability, or ``workflow/<name>`` for a child run."""
    return data.capability or (f"workflow/{data.workflow}" if data.workflow else "")


_NOTED = (ev.GuardFailed, ev.EventReceived, ev.TimerScheduled, ev.TimerFired)
"""Records that become span events of the state visit they happen in."""


def _note(
    record: ev.GuardFailed | ev.EventReceived | ev.TimerScheduled | ev.TimerFired,
) -> tuple[str, str, dict[str, Any]]:
    if isinstance(record, ev.GuardFailed):
        d = record.data
        return (
            record.time,
            "guard.failed",
            {
                "interlock.guard": d.guard,
                "interlock.guard.error": d.error,
                "interlock.transition.index": d.transition,
                "cloudevents.event_type": d.event_type,
            },
        )
    if isinstance(record, ev.TimerScheduled):
        t = record.data
        attrs: dict[str, Any] = {
            "interlock.timer.id": t.timer_id,
            "interlock.timer.purpose": t.purpose,
            "interlock.timer.fire_at": t.fire_at,
        }
        if t.action_id:
            attrs["interlock.action.id"] = t.action_id
        return record.time, "timer.scheduled", attrs
    if isinstance(record, ev.TimerFired):
        return record.time, "timer.fired", {"interlock.timer.id": record.data.timer_id}
    event = record.data.event
    return (
        record.time,
        "event.received",
        {
            "cloudevents.event_type": str(event.get("type", "")),
            "cloudevents.event_id": str(event.get("id", "")),
            "cloudevents.event_source": str(event.get("source", "")),
        },
    )


def _started(run: RunView, record: ev.RunStarted, at: int) -> None:
    d = record.data
    run.workflow, run.namespace, run.version = d.workflow, d.namespace, d.version
    run.traceparent = record.traceparent
    run.started_at = record.time


def _entered(run: RunView, record: ev.StateEntered, at: int) -> None:
    run.visit = Visit(record.data.state, at, record.time)


def _requested(run: RunView, record: ev.ActionRequested, at: int) -> None:
    a = record.data
    run.pending[a.action_id] = PendingView(
        a.action_id,
        action_target(a),
        a.index,
        a.attempt,
        record.time,
        run.visit.seq if run.visit else 0,
    )


def _answered(
    run: RunView, record: ev.ActionCompleted | ev.ActionFailed | ev.ActionCancelled, at: int
) -> None:
    run.pending.pop(record.data.action_id, None)


def _noted(
    run: RunView,
    record: ev.GuardFailed | ev.EventReceived | ev.TimerScheduled | ev.TimerFired,
    at: int,
) -> None:
    if run.visit is not None:
        run.visit.notes.append(_note(record))


def _ended(run: RunView, record: ev.Record, at: int) -> None:
    run.status = RUN_STATUSES[type(record)]


ACTION_OUTCOMES: dict[type, str] = {
    ev.ActionCompleted: "completed",
    ev.ActionFailed: "failed",
    ev.ActionCancelled: "cancelled",
}
"""The records that end an action's attempt, and the outcome each names."""
RUN_STATUSES: dict[type, RunStatus] = {
    ev.RunCompleted: RunStatus.COMPLETED,
    ev.RunFailed: RunStatus.FAILED,
    ev.RunCancelled: RunStatus.CANCELLED,
    ev.RunContinued: RunStatus.CONTINUED,
}
"""The records that end a run's log, and the status each leaves it in."""
VIEW_CHANGES: dict[type, Callable[[RunView, Any, int], None]] = {
    ev.RunStarted: _started,
    ev.StateEntered: _entered,
    ev.ActionRequested: _requested,
    **dict.fromkeys(ACTION_OUTCOMES, _answered),
    **dict.fromkeys(_NOTED, _noted),
    **dict.fromkeys(RUN_STATUSES, _ended),
}
"""How each kind of record changes a :class:`RunView` (beyond its position), looked up
by the record's type: every record kind is a direct subclass of ``Record``."""
