"""Why a run moved, and what another definition would have done with the same inputs. Pure.

A run's log holds every external input the run ever took: its trigger and inputs
(``run.started``), agents' answers (``action.completed`` / ``action.failed``), external
events (``event.received``, a full copy), due timers (``timer.fired``) and cancellation
(``run.cancelled``). Each of them begins one *step*: the records one decision appended.
Re-driving those inputs, in log order, through :func:`~interlock.core.engine.decide` with a
definition gives the log that definition would have written:

- with the run's own definition it gives the same records, and the engine's guard trace
  says why each step went where it did (:func:`explain`);
- with another definition, the first record where the two logs differ is where the new
  definition would have taken the run elsewhere, and why (:func:`replay`); over many runs,
  how a candidate would change recorded traffic (:func:`shadow`).

What a log cannot say is what an event the run ignored would have done: an event that
found no ``on`` entry in the run's state was never recorded. A re-drive therefore goes "as
far as the recorded inputs allow".

Everything here returns plain JSON-ready values; the shapes are documented in
docs/debugging.md. This module explains a run (:func:`explain`, :func:`waiting`) and is
where callers find every analysis: cutting and re-driving a log is in
:mod:`interlock.core.redrive`, replay and shadow in :mod:`interlock.core.replay`, fork and
migration in :mod:`interlock.core.fork`, how records read in
:mod:`interlock.core.record_text`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.engine import (
    TASK_COMPLETED,
    TASK_FAILED,
)
from interlock.core.fork import NotPossible, acted_on, fork, migration
from interlock.core.pauses import PAUSED
from interlock.core.record_text import (
    check_json,
    check_text,
    record_json,
    record_line,
    short,
    summarize,
)
from interlock.core.redrive import (
    ADMIT,
    ANSWER,
    CANCEL,
    EVENT,
    FORK,
    MIGRATE,
    PAUSE,
    REPLAY_SOURCE,
    RESUME,
    START,
    TIMER,
    Drive,
    Redriven,
    Step,
    boundaries,
    describe_input,
    event_of,
    redrive,
    run_step,
    steps,
)
from interlock.core.replay import (
    RUNS_LISTED,
    Shadow,
    comparable,
    end_of,
    first_divergence,
    replay,
    shadow,
    workflow_of,
)
from interlock.core.retryafter import retry_wait
from interlock.core.rfc3339 import parse_time
from interlock.core.state import RunState, fold
from interlock.core.vocabulary import RunStatus, TimerPurpose

__all__ = [
    "ANSWER",
    "CANCEL",
    "EVENT",
    "FORK",
    "MIGRATE",
    "REPLAY_SOURCE",
    "RUNS_LISTED",
    "START",
    "TIMER",
    "NotPossible",
    "Redriven",
    "Shadow",
    "Step",
    "acted_on",
    "boundaries",
    "check_json",
    "check_text",
    "describe_input",
    "event_of",
    "explain",
    "fork",
    "migration",
    "record_json",
    "record_line",
    "redrive",
    "replay",
    "shadow",
    "short",
    "steps",
    "summarize",
    "version_of",
    "versions_named",
    "waiting",
]


def explain(
    records: Sequence[ev.AnyRecord],
    definition: Definition,
    *,
    at: int | None = None,
    versions: Mapping[int, Definition] | None = None,
) -> dict[str, Any]:
    """Why the run went where it went: for each step, its input, every ``on`` entry that
    was weighed with the values its guard read, the entry that fired (or why none did), and
    what ``set`` and ``outputs`` produced; for a running run, what would move it now.

    ``definition`` must be the one the run ran (its version); when re-driving it does not
    give the recorded records, ``reproduces`` is false and says where. A run that moved
    between versions (a migration, a fork onto another version) is explained step by step
    with the version in force at each step when ``versions`` has it.
    """
    if not records:
        raise ValueError("an empty log")
    if at is not None and not 1 <= at <= len(records):
        raise ValueError(f"--at {at}: the log has records 1 to {len(records)}")
    drive = Drive(definition, fold(records).version)
    recorded = RunState()
    explained: list[dict[str, Any]] = []
    mismatch: dict[str, Any] | None = None
    queued_at: dict[str, str] = {}
    for step in steps(records):
        # Each step is weighed from the recorded state, whatever this definition did before,
        # by the version in force then.
        drive.state = recorded
        drive.definition = (versions or {}).get(version_of(step, recorded), definition)
        outcome = run_step(drive, step, recorded)
        if mismatch is None:
            for k in range(max(len(step.records), len(outcome.records))):
                old = step.records[k] if k < len(step.records) else None
                new = outcome.records[k] if k < len(outcome.records) else None
                if comparable(old, old) != comparable(new, old):
                    mismatch = first_divergence(
                        definition, step, step.first + k, old, new, outcome, recorded
                    )
                    break
        waits = _waits(step.first, step.records, queued_at)
        if at is None or step.first <= at <= step.last:
            explained.append(_explain_step(step, recorded, outcome))
            for line in explained[-1]["records"]:
                if line["seq"] in waits:
                    line["summary"] += f" (after {waits[line['seq']]} in line)"
        recorded = fold(step.records, recorded)
    # With --at: the run as it stood once the step holding record ``at`` was decided.
    final = recorded if at is None else fold(records[: explained[-1]["last"]])
    out: dict[str, Any] = {
        "run_id": records[0].subject,
        "workflow": workflow_of(records),
        "definition": {"name": definition.name, "spec_hash": definition.spec_hash},
        "status": recorded.status,
        "reproduces": mismatch is None,
        "steps": explained,
    }
    if recorded.chain is not None:
        c = recorded.chain
        out["chain"] = {"link": c.link, "previous": c.previous, "next": c.next}
    if mismatch is not None:
        out["mismatch"] = {k: mismatch[k] for k in ("seq", "kind", "reason")}
    if final.status == RunStatus.RUNNING:
        out["waiting"] = waiting(definition, final)
        queued = _queued(records[: final.seq])
        if queued is not None:
            out["waiting"]["queued"] = queued
    else:
        out["end"] = end_of(final)
    return out


def _waits(
    first: int, records: Sequence[ev.AnyRecord], queued_at: dict[str, str]
) -> dict[int, str]:
    """How long each admission in ``records`` waited since the run (key ``""``) or the
    request was first queued, by the admission's log position; ``queued_at`` carries the
    lines still waiting from one step to the next."""
    out: dict[int, str] = {}
    for seq, record in enumerate(records, first):
        line = (
            record.data.action_id if isinstance(record, ev.ActionQueued | ev.ActionAdmitted) else ""
        )
        if isinstance(record, ev.RunQueued | ev.ActionQueued):
            queued_at.setdefault(line, record.time)
        elif isinstance(record, ev.RunAdmitted | ev.ActionAdmitted) and line in queued_at:
            waited = (parse_time(record.time) - parse_time(queued_at.pop(line))).total_seconds()
            if waited >= 0.05:  # (a wait of a few milliseconds is no wait to a reader)
                out[seq] = f"{waited:.1f}s"
    return out


def _queued(records: Sequence[ev.AnyRecord]) -> dict[str, Any] | None:
    """The ``run.queued`` a run waits on to be admitted (None: it waits for none), as
    ``{"seq", "summary"}``."""
    last: dict[str, Any] | None = None
    for seq, record in enumerate(records, 1):
        if isinstance(record, ev.RunQueued):
            last = {"seq": seq, "summary": summarize(record)}
        elif isinstance(record, ev.RunAdmitted):
            last = None
    return last


def version_of(step: Step, before: RunState) -> int:
    """The version of the workflow that made a step's decision."""
    head = step.head
    if isinstance(head, ev.RunStarted | ev.RunForked | ev.RunMigrated):
        return head.data.version
    return before.version


def versions_named(records: Iterable[ev.AnyRecord]) -> list[int]:
    """Every version of its workflow a log says the run was on, in order."""
    out: list[int] = []
    for record in records:
        if (
            isinstance(record, ev.RunStarted | ev.RunForked | ev.RunMigrated)
            and record.data.version not in out
        ):
            out.append(record.data.version)
    return out


def _explain_step(step: Step, before: RunState, outcome: Redriven) -> dict[str, Any]:
    records = step.records
    out: dict[str, Any] = {
        "seq": step.first,
        "last": step.last,
        "state": before.state or None,
        "input": describe_input(step),
        "checks": [check_json(c) for c in outcome.checks],
        "explanation": [check_text(c) for c in outcome.checks],
    }
    fired = next((r for r in records if isinstance(r, ev.TransitionFired)), None)
    if fired is not None:
        out["fired"] = {
            "entry": fired.data.transition,
            "from": fired.data.from_state,
            "to": fired.data.to_state,
            "on": fired.data.event_type,
            "set": fired.data.set,
        }
    else:
        out["fired"] = None
        out["why_none"] = _why_none(step, before, outcome)
    writes = [r.data.context_writes for r in records if isinstance(r, ev.ActionCompleted)]
    if any(writes):
        out["context_writes"] = {k: v for w in writes for k, v in w.items()}
    for record in records:
        if isinstance(record, ev.RunCompleted | ev.RunFailed) and record.data.outputs:
            out["outputs"] = record.data.outputs
    out["records"] = [record_line(step.first + i, r) for i, r in enumerate(records)]
    return out


def _why_none(step: Step, before: RunState, outcome: Redriven) -> str:
    head = step.head
    if step.kind == START:
        return "the run started"
    if step.kind in (CANCEL, FORK, MIGRATE, PAUSE, RESUME):
        return f"a {step.kind}, not a transition"
    if isinstance(head, ev.EventHeld) and before.paused is None and before.waits is not None:
        return "held: the run waits for its slots (decided on when it is admitted)"
    if isinstance(head, ev.EventHeld):
        return "held: the run is paused (decided on when it is resumed)"
    if outcome.checks:
        if all(c.outcome != "fired" for c in outcome.checks):
            return "every `on` entry for the event was weighed and none gave true"
        # An entry (or a catch) fired and did not move the run: its `set` or its budget
        # failed, and with it the run.
        return "the entry that fired could not be taken: the run failed"
    if isinstance(head, ev.ActionCompleted | ev.ActionFailed):
        if any(isinstance(r, ev.ActionRequested) for r in step.records):
            return (
                "the state's next action was requested (no `on` entry is weighed before "
                "the state's last action is done)"
            )
        if any(isinstance(r, ev.RunFailed) for r in step.records):
            return "the failure was not caught: the run failed"
        for r in step.records:
            if isinstance(r, ev.TimerScheduled) and r.data.retry_after_s is not None:
                return "the failure is retried" + retry_wait(r.data).replace(" (", ", at ")[:-1]
            if isinstance(r, ev.TimerScheduled):
                return "the failure is retried after a backoff"
        return f"state {before.state!r} has no `on` entry for this answer"
    if isinstance(head, ev.TimerFired):
        return _timer_moved(head.data.purpose, step.records)
    if step.kind == ADMIT and any(isinstance(r, ev.StateEntered) for r in step.records):
        holds = any(
            isinstance(r, ev.RunAdmitted) and any(not x.endswith(PAUSED) for x in r.data.limits)
            for r in step.records
        )
        return "admitted: " + ("it holds its slots, and " if holds else "it ") + "enters its state"
    return "no `on` entry applies"


def _timer_moved(purpose: str, records: Sequence[ev.AnyRecord]) -> str:
    """What a timer that took no transition did."""
    # What a held request's admission, recorded in the same step, adds is not the timer's.
    effects = [
        r
        for r in records[1:]
        if not isinstance(r, ev.ActionAdmitted | ev.ActionQueued)
        and not (isinstance(r, ev.TimerScheduled) and r.data.purpose == TimerPurpose.ACTION_TIMEOUT)
    ]
    if any(isinstance(r, ev.RunQueued) for r in effects):
        return f"the {purpose} timer came due: the run goes on to its admission"
    if not effects:
        admitted = any(isinstance(r, ev.ActionAdmitted) for r in records)
        return (
            f"the {purpose} timer changed nothing: what it timed had ended, or was held "
            "and had not started" + ("; then a held request was admitted" if admitted else "")
        )
    for r in records:
        if isinstance(r, ev.ActionRequested):
            return f"the {purpose} timer asked for attempt {r.data.attempt} of the action"
    if any(isinstance(r, ev.ActionFailed) for r in records) and any(
        isinstance(r, ev.TimerScheduled) and r.data.purpose == TimerPurpose.RETRY for r in records
    ):
        return f"the {purpose} timer failed the attempt, which is retried after a backoff"
    if any(isinstance(r, ev.RunFailed) for r in records):
        return f"the {purpose} timer failed the run (nothing caught it)"
    return f"the {purpose} timer moved the run without a guard"


def waiting(definition: Definition, state: RunState) -> dict[str, Any]:
    """What would move a running run now: the answers it awaits, the events (and their
    guards) its state takes, and its timers."""
    current = definition.states.get(state.state)
    answers = []
    for pending in state.pending.values():
        accepts = [TASK_COMPLETED, TASK_FAILED]
        if current is not None:
            accepts += [e for e in current.by_event if e not in accepts and e != TASK_FAILED]
        answers.append(
            {
                "action_id": pending.action_id,
                "capability": pending.workflow or pending.capability,
                "attempt": pending.attempt,
                "deadline": pending.deadline,
                "accepts": accepts,
                **({"held": pending.queued} if pending.held else {}),
            }
        )
    events = []
    if current is not None:
        for event_type, entries in current.by_event.items():
            if event_type in (TASK_COMPLETED, TASK_FAILED):
                continue
            events.append(
                {
                    "type": event_type,
                    "entries": [
                        {
                            "entry": t.index,
                            "guard": None if t.guard is None else t.guard.source,
                            "goto": t.goto,
                        }
                        for t in entries
                    ],
                }
            )
    # A held request's timeout starts at its admission: the timer its request scheduled
    # is void (it fires and changes nothing).
    held = {p.action_id for p in state.pending.values() if p.held}
    timers = [
        {"timer_id": t.timer_id, "purpose": t.purpose, "fire_at": t.fire_at}
        for t in state.timers.values()
        if not (t.purpose == TimerPurpose.ACTION_TIMEOUT and t.action_id in held)
    ]
    if current is not None and current.timeout is not None:
        for timer in timers:
            if timer["purpose"] == TimerPurpose.STATE_TIMEOUT:
                timer["goto"] = current.timeout.goto
    out = {"state": state.state, "answers": answers, "events": events, "timers": timers}
    if state.paused is not None or state.waits is not None:
        # What reaches it is held until then (the lists above are what it takes after).
        out["held_until"] = "resumed" if state.paused is not None else "admitted"
    return out
