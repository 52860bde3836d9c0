"""What another definition would have done with a run's recorded inputs. Pure.

:func:`replay` re-drives one run with a candidate definition and reports the first record
where the two logs differ, and why (the guards, the state, the event that took the run
elsewhere); :class:`Shadow` does it over many runs, one log at a time, and groups them by
how the candidate would change them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.engine import (
    TASK_FAILED,
)
from interlock.core.record_text import (
    check_json,
    check_text,
    record_json,
    record_line,
    short,
    summarize,
)
from interlock.core.redrive import (
    ANSWER,
    EVENT,
    START,
    TIMER,
    Drive,
    Redriven,
    Step,
    describe_input,
    run_step,
    steps,
)
from interlock.core.state import RunState, fold

_VERSIONED = (ev.RunStarted, ev.RunForked, ev.RunMigrated)


def comparable(record: ev.AnyRecord | None, like: ev.AnyRecord | None) -> Any:
    """A record as compared: what names the definition (its version and spec hash) is left
    out, and so are fields newer than the recorded log (an answer's ``source``, a request's
    ``traceparent``) when the recorded record has none."""
    if record is None:
        return None
    value = msgspec.to_builtins(record)
    if like is not None and like.traceparent is None:
        value.pop("traceparent", None)
    data = value.get("data", {})
    if isinstance(record, _VERSIONED):
        for key in ("version", "spec_hash", "from_version", "from_spec_hash"):
            data.pop(key, None)
    if (
        isinstance(record, ev.ActionCompleted | ev.ActionFailed)
        and isinstance(like, ev.ActionCompleted | ev.ActionFailed)
        and like.data.source is None
    ):
        data.pop("source", None)
    return value


def _differences(recorded: Any, replayed: Any, path: str = "") -> list[str]:
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        out: list[str] = []
        for key in [*recorded, *(k for k in replayed if k not in recorded)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in replayed:
                out.append(f"{where}: recorded {short(recorded[key])}, now absent")
            elif key not in recorded:
                out.append(f"{where}: not recorded, now {short(replayed[key])}")
            else:
                out.extend(_differences(recorded[key], replayed[key], where))
        return out
    if recorded != replayed or type(recorded) is not type(replayed):
        where = f"{path}: " if path else ""  # two whole records: no path to name
        return [f"{where}recorded {short(recorded)}, now {short(replayed)}"]
    return []


def _states_named(record: ev.AnyRecord) -> list[str]:
    d: Any = record.data
    if isinstance(record, ev.TransitionFired):
        return [d.to_state]
    if isinstance(record, ev.StateEntered | ev.ActionRequested | ev.RunCompleted):
        return [d.state]
    return []


def _entered_at_start(step: Step, position: int) -> str:
    """The state the recorded run had entered before record ``position`` of the step that
    started it ("" when none yet)."""
    state = ""
    for record in step.records[: position - step.first]:
        if isinstance(record, ev.StateEntered):
            state = record.data.state
    return state


def _in(state: str, word: str = "state ") -> str:
    """Where a divergence is: ``in state 'review'`` (``in 'review'`` without ``word``), or
    before the first state at the run's start."""
    return f"in {word}{state!r}" if state else "before the first state"


def first_divergence(
    definition: Definition,
    step: Step,
    position: int,
    recorded: ev.AnyRecord | None,
    replayed: ev.AnyRecord | None,
    outcome: Redriven,
    before: RunState,
) -> dict[str, Any]:
    """Why the first differing record differs."""
    state = before.state or _entered_at_start(step, position)
    out: dict[str, Any] = {
        "seq": position,
        "state": state,
        "input": describe_input(step),
        "recorded": None if recorded is None else record_json(recorded),
        "replayed": None if replayed is None else record_json(replayed),
    }
    if outcome.checks:
        out["checks"] = [check_json(c) for c in outcome.checks]
    recorded_to = _goes_to(step)
    replayed_to = next(
        (r.data.to_state for r in outcome.records if isinstance(r, ev.TransitionFired)), None
    )
    missing = [
        s for s in (_states_named(recorded) if recorded else []) if s not in definition.states
    ]
    if state and state not in definition.states and step.kind != START:
        kind = "state_missing"
        reason = f"state {state!r}, where the run was, does not exist in the new definition"
        group = f"state {state!r} no longer exists"
    elif missing:
        kind = "state_missing"
        reason = (
            f"the run went to state {missing[0]!r}, which does not exist in the new definition"
            + (f" (it goes to {replayed_to!r} instead)" if replayed_to else "")
        )
        group = f"state {missing[0]!r} no longer exists"
    elif outcome.not_taken is not None:
        kind = {
            ANSWER: "answer_not_awaited",
            TIMER: "timer_not_set",
            EVENT: "event_not_taken",
            START: "not_started",
        }.get(step.kind, "input_not_taken")
        reason = outcome.not_taken
        group = _group_not_taken(kind, step, before, state)
    elif (
        isinstance(recorded, ev.ActionRequested)
        and isinstance(replayed, ev.ActionRequested)
        and recorded.data.state == replayed.data.state
        and recorded.data.index == replayed.data.index
        and recorded.data.input != replayed.data.input
    ):
        kind = "action_input"
        target = recorded.data.workflow or recorded.data.capability
        diffs = _differences(recorded.data.input, replayed.data.input, "input")
        reason = f"the input of {target} (state {recorded.data.state!r}) differs: " + "; ".join(
            diffs[:3]
        )
        group = f"input of {target} in state {recorded.data.state!r} differs"
        out["differences"] = diffs
    elif (
        recorded_to != replayed_to
        or isinstance(recorded, ev.TransitionFired | ev.GuardFailed)
        or (isinstance(replayed, ev.TransitionFired | ev.GuardFailed))
    ):
        kind = "guard"
        reason, group = _guard_difference(step, state, recorded_to, replayed_to, outcome, out)
    else:
        kind = "record"
        reason, group = _record_difference(recorded, replayed, state, out)
    out.update(kind=kind, reason=reason, group=group)
    return out


def _guard_difference(
    step: Step,
    state: str,
    recorded_to: str | None,
    replayed_to: str | None,
    outcome: Redriven,
    out: dict[str, Any],
) -> tuple[str, str]:
    """The run's transition differs: the reason (with the guards' verdicts) and the group."""
    event_type = _event_type(step)
    took = f"goes to {replayed_to!r}" if replayed_to else "takes no `on` entry"
    was = f"went to {recorded_to!r}" if recorded_to else "took no `on` entry"
    deciding = [c for c in outcome.checks if c.outcome != "fired"] or outcome.checks
    detail = "; ".join(check_text(c) for c in outcome.checks) or "no `on` entry matches"
    reason = f"on {event_type} {_in(state)} the run {was}; now it {took}: {detail}"
    group = f"on {event_type} {_in(state, '')}: {recorded_to or '(stays)'} -> " + (
        replayed_to or "(stays)"
    )
    if deciding:
        out["guard"] = check_json(deciding[0])
    return reason, group


def _record_difference(
    recorded: ev.AnyRecord | None,
    replayed: ev.AnyRecord | None,
    state: str,
    out: dict[str, Any],
) -> tuple[str, str]:
    """Another record differs (or one log has a record more): the reason and the group."""
    diffs = _differences(comparable(recorded, recorded), comparable(replayed, recorded))
    either = recorded if recorded is not None else replayed
    what = "record" if either is None else ev.record_type(either).removeprefix(ev.PREFIX)
    if recorded is None:
        reason = (
            "the logs differ"
            if replayed is None
            else f"the new definition writes one more record: {summarize(replayed)}"
        )
    elif replayed is None:
        reason = f"the new definition does not write {summarize(recorded)}"
    else:
        reason = f"{what} differs: " + "; ".join(diffs[:3])
    group = f"{what} {_in(state)} differs"
    out["differences"] = diffs
    return reason, group


def _group_not_taken(kind: str, step: Step, before: RunState, state: str) -> str:
    head = step.head
    if isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        old = before.pending.get(head.data.action_id)
        what = old.capability if old is not None else "an action"
        return f"answer of {what} no longer awaited"
    if isinstance(head, ev.EventReceived | ev.EvidenceRecorded | ev.EventHeld):
        return f"{head.data.event.get('type')} not taken"
    if isinstance(head, ev.TimerFired):
        return f"{head.data.purpose} timer not set" if head.data.purpose else "timer not set"
    return f"{kind} {_in(state, '')}"


def _event_type(step: Step) -> str:
    head = step.head
    if isinstance(head, ev.ActionCompleted):
        return head.data.event_type
    if isinstance(head, ev.ActionFailed):
        return TASK_FAILED
    if isinstance(head, ev.EventReceived | ev.EvidenceRecorded | ev.EventHeld):
        return str(head.data.event.get("type", ""))
    if isinstance(head, ev.TimerFired):
        return f"timer {head.data.purpose}"
    return step.kind


def _goes_to(step: Step) -> str | None:
    return next((r.data.to_state for r in step.records if isinstance(r, ev.TransitionFired)), None)


def end_of(state: RunState) -> dict[str, Any]:
    out: dict[str, Any] = {"status": state.status, "state": state.state}
    if state.outputs is not None:
        out["outputs"] = state.outputs
    if state.error is not None:
        out["error"] = {"class": state.error.error_class, "message": state.error.message}
    if state.chain is not None and state.chain.next is not None:
        out["continued_as"] = state.chain.next
    return out


def replay(
    records: Sequence[ev.AnyRecord],
    definition: Definition,
    *,
    version: int = 0,
    label: str = "",
) -> dict[str, Any]:
    """Re-drive a recorded run's inputs through ``definition`` and compare the logs.

    Returns the report documented in docs/debugging.md: ``agree``, the first
    ``divergence`` (its log position, kind, reason and both records), the records the new
    run goes on with after it (``continuation``), the inputs it could not take
    (``skipped``) and how each run ends.
    """
    if not records:
        raise ValueError("an empty log")
    drive = Drive(definition, version)
    recorded = RunState()
    divergence: dict[str, Any] | None = None
    continuation: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for step in steps(records):
        outcome = run_step(drive, step, recorded)
        new_first = drive.state.seq + 1
        if divergence is None:
            for k in range(max(len(step.records), len(outcome.records))):
                old = step.records[k] if k < len(step.records) else None
                new = outcome.records[k] if k < len(outcome.records) else None
                if comparable(old, old) == comparable(new, old):
                    continue
                divergence = first_divergence(
                    definition, step, step.first + k, old, new, outcome, recorded
                )
                divergence["replayed_seq"] = new_first + k if new is not None else None
                continuation.extend(
                    record_line(new_first + j, r) for j, r in enumerate(outcome.records) if j >= k
                )
                break
        elif outcome.records:
            continuation.extend(
                record_line(new_first + j, r) for j, r in enumerate(outcome.records)
            )
        if divergence is not None and outcome.not_taken is not None:
            skipped.append(
                {"seq": step.first, "input": describe_input(step), "reason": outcome.not_taken}
            )
        drive.take(outcome.records)
        recorded = fold(step.records, recorded)
    return {
        "run_id": records[0].subject,
        "workflow": workflow_of(records),
        "against": {
            "name": definition.name,
            "namespace": definition.namespace,
            "version": version or None,
            "spec_hash": definition.spec_hash,
            "label": label or None,
        },
        "agree": divergence is None,
        "records": len(records),
        "replayed": len(drive.log),
        "divergence": divergence,
        "continuation": continuation,
        "skipped": skipped,
        "recorded_end": end_of(recorded),
        "replayed_end": end_of(drive.state),
        "same_end": end_of(recorded) == end_of(drive.state),
    }


def workflow_of(records: Sequence[ev.AnyRecord]) -> dict[str, Any]:
    state = fold(records)
    return {
        "name": state.workflow,
        "namespace": state.namespace,
        "version": state.version,
        "spec_hash": state.spec_hash,
    }


RUNS_LISTED = 50
"""How many run ids a shadow group lists (its ``count`` counts them all)."""


class Shadow:
    """Replays runs against a candidate one at a time (so only one log is held at once)
    and keeps the summary: how many agree, how many would end the same, and the divergent
    ones grouped by where and why, with one example of each group."""

    def __init__(self, candidate: Definition, *, version: int = 0, label: str = "") -> None:
        self.candidate = candidate
        self.version = version
        self.label = label
        self.total = self.agree = self.same_end = 0
        self.groups: dict[tuple[str, str], dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []

    def add(self, records: Sequence[ev.AnyRecord]) -> None:
        if not records:
            return
        self.total += 1
        try:
            report = replay(records, self.candidate, version=self.version, label=self.label)
        # A log this version cannot re-drive is reported, not fatal.
        except Exception as exc:  # noqa: BLE001
            self.errors.append({"run_id": records[0].subject, "error": str(exc)})
            return
        self.agree += report["agree"]
        self.same_end += report["same_end"]
        found = report["divergence"]
        if found is None:
            return
        key = (found["kind"], found["group"])
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = {
                "kind": found["kind"],
                "where": {
                    "state": found["state"],
                    "event_type": found["input"].get("type") or found["input"]["kind"],
                    "record": (found["recorded"] or found["replayed"] or {}).get("type"),
                },
                "why": found["group"],
                "count": 0,
                "same_end": 0,
                "runs": [],
                "example": {
                    "run_id": report["run_id"],
                    "seq": found["seq"],
                    "reason": found["reason"],
                    "recorded_end": report["recorded_end"],
                    "replayed_end": report["replayed_end"],
                },
            }
        group["count"] += 1
        group["same_end"] += report["same_end"]
        if len(group["runs"]) < RUNS_LISTED:
            group["runs"].append(report["run_id"])

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.groups.values(), key=lambda g: (-g["count"], g["why"]))
        return {
            "candidate": {
                "name": self.candidate.name,
                "namespace": self.candidate.namespace,
                "version": self.version or None,
                "spec_hash": self.candidate.spec_hash,
                "label": self.label or None,
            },
            "runs": self.total,
            "agree": self.agree,
            "diverge": self.total - self.agree - len(self.errors),
            "same_end": self.same_end,
            "groups": ordered,
            "errors": self.errors,
        }


def shadow(
    logs: Iterable[Sequence[ev.AnyRecord]],
    candidate: Definition,
    *,
    version: int = 0,
    label: str = "",
) -> dict[str, Any]:
    """Replay every log against ``candidate`` (see :class:`Shadow`)."""
    summary = Shadow(candidate, version=version, label=label)
    for records in logs:
        summary.add(records)
    return summary.summary()
