"""How records and guard checks read, in JSON and in one line of text, in what the
analyses return (the shapes are documented in docs/debugging.md). Pure.
"""

from __future__ import annotations

from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.cel_text import plain_cel_error
from interlock.core.engine import (
    GuardCheck,
)
from interlock.core.expr import ABSENT
from interlock.core.pauses import admitted_text, slot_text, stopping_text, waiting_for
from interlock.core.retryafter import retry_wait
from interlock.core.rfc3339 import parse_time


def short(value: Any) -> str:
    """A value as compact JSON, cut at 120 characters."""
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 120 else text[:117] + "..."


def record_json(record: ev.AnyRecord) -> dict[str, Any]:
    """A record as JSON (its CloudEvent, structured mode)."""
    out: dict[str, Any] = msgspec.to_builtins(record)
    return out


def _since(earlier: str, later: str) -> str:
    """The time from one record time to another, as ``10.0s``."""
    return f"{(parse_time(later) - parse_time(earlier)).total_seconds():.1f}s"


def summarize(record: ev.AnyRecord) -> str:
    """One line saying what a record means."""
    d: Any = record.data
    kind = ev.record_type(record).removeprefix(ev.PREFIX)
    if isinstance(record, ev.RunStarted):
        w = d.window
        came = (
            ""
            if w is None
            else f" from a {w.kind} window of {w.count} event(s) for key {w.key!r} of "
            f"{w.trigger}, opened {_since(w.opened_at, record.time)} before, closed by "
            f"{w.closed_by} (events {', '.join(w.events)})"
        )
        return f"{kind} {d.workflow} v{d.version}{came}"
    if isinstance(record, ev.RunQueued) and d.rate is not None:
        r = d.rate
        return f"{kind} until {r.until} by the rate of {r.trigger} for key {r.key!r}"
    if isinstance(record, ev.RunQueued) and not d.slots:  # its rate's wait over, no limit
        return f"{kind} for no slot (admitted next)"
    if isinstance(record, ev.RunQueued):
        return " ".join([kind, ", ".join(slot_text(c) for c in d.slots)])
    if isinstance(record, ev.RunAdmitted) and d.limits:
        return f"{kind}: {admitted_text(d.limits)}"
    if isinstance(record, ev.StateEntered):
        return f"{kind} {d.state}"
    if isinstance(record, ev.ActionRequested):
        target = d.workflow or d.capability
        limits = f" limited by {', '.join(c.limit for c in d.limits)}" if d.limits else ""
        if d.admitted_at is not None:
            limits += ", admitted at once, dispatched"
        return f"{kind} {target} input={short(d.input)}{limits}" + (
            f" (attempt {d.attempt})" if d.attempt > 1 else ""
        )
    if isinstance(record, ev.ActionCompleted):
        return f"{kind} {d.action_id} result={short(d.result)}"
    if isinstance(record, ev.ActionFailed):
        return f"{kind} {d.action_id} {d.error.error_class}: {plain_cel_error(d.error.message)}"
    if isinstance(record, ev.EventReceived):
        return f"{kind} {d.event.get('type')} id={d.event.get('id')}"
    if isinstance(record, ev.GuardFailed):
        return f"{kind} {d.state} on[{d.transition}] `{d.guard}`: {plain_cel_error(d.error)}"
    if isinstance(record, ev.TransitionFired):
        sets = f" set={short(d.set)}" if d.set else ""
        errors = ", ".join(f"on[{i}]" for i in d.guard_errors)
        why = f" (decided by an error: the guard of {errors} failed)" if errors else ""
        return f"{kind} {d.from_state} -> {d.to_state} on {d.event_type}{sets}{why}"
    if isinstance(record, ev.TimerScheduled):
        return f"{kind} {d.purpose} at {d.fire_at}{retry_wait(d)}"
    if isinstance(record, ev.TimerFired):
        return f"{kind} {d.purpose or d.timer_id}"
    if isinstance(record, ev.RunCompleted):
        return f"{kind} in {d.state} outputs={short(d.outputs)}"
    if isinstance(record, ev.RunFailed):
        return f"{kind} {d.error.error_class}: {plain_cel_error(d.error.message)}"
    if isinstance(record, ev.RunCancelled):
        return f"{kind}: {d.reason}{stopping_text(d.freed)}"
    if isinstance(record, ev.RunForked):
        return f"{kind} from {d.origin_run_id} at {d.origin_seq}, v{d.version}, state {d.state}"
    if isinstance(record, ev.RunMigrated):
        return f"{kind} v{d.from_version} -> v{d.version}"
    if isinstance(record, ev.RunContinued):
        return f"{kind} as {d.run_id} in {d.state} ({d.reason})"
    if isinstance(record, ev.ActionCancelled):
        return f"{kind} {d.action_id}: {d.reason}{stopping_text([d.freed] if d.freed else [])}"
    if isinstance(record, ev.ActionQueued):
        return f"{kind} {d.action_id} {waiting_for(d.limit, d.key)} (place {d.place})"
    if isinstance(record, ev.RunPaused):
        return f"{kind}{' with its workflow' if d.workflow else ''}: {d.reason}"
    if isinstance(record, ev.EventHeld):
        return f"{kind} {d.event.get('type')} id={d.event.get('id')} (decided on when resumed)"
    if isinstance(record, ev.RunResumed):
        return f"{kind}, {d.held} held event(s) decided on"
    if isinstance(record, ev.ActionAdmitted):
        return f"{kind} {d.action_id}, dispatched" + (
            f"; deadline {d.deadline}" if d.deadline else ""
        )
    return kind


def record_line(position: int, record: ev.AnyRecord) -> dict[str, Any]:
    """A record as a line of a report: its position, type and summary."""
    return {"seq": position, "type": ev.record_type(record), "summary": summarize(record)}


def check_json(check: GuardCheck) -> dict[str, Any]:
    """A guard check as JSON."""
    out: dict[str, Any] = {
        "state": check.state,
        "event_type": check.event_type,
        "entry": check.transition,
        "goto": check.goto,
        "guard": check.guard,
        "outcome": check.outcome,
    }
    if check.guard is not None and check.outcome in ("fired", "false", "not_boolean"):
        out["value"] = check.value
    if check.error is not None:
        out["error"] = plain_cel_error(check.error)
    if check.reads:
        out["reads"] = check.reads
    return out


def check_text(check: GuardCheck) -> str:
    """``result.score > 7``: result.score = 6, so false."""
    where = "catch" if check.transition < 0 else f"on[{check.transition}]"
    if check.guard is None:
        return f"{where} {check.event_type} -> {check.goto}: no guard, fired"
    reads = ", ".join(
        f"{k} is absent" if v == ABSENT else f"{k} = {short(v)}" for k, v in check.reads.items()
    )
    reads = f" ({reads})" if reads else ""
    if check.outcome == "fired":
        verdict = "true, fired"
    elif check.outcome == "false":
        verdict = "false"
    elif check.outcome == "error":
        verdict = f"error: {plain_cel_error(check.error or '')} (fail-closed)"
    else:
        verdict = f"{short(check.value)}, not a boolean (fail-closed)"
    return f"{where} {check.event_type} -> {check.goto}: `{check.guard}`{reads}: {verdict}"
