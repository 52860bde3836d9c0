"""A run log for people: one line per record, and the state after each step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.cel_text import plain_cel_error
from interlock.core.pauses import admitted_text, slot_text, stopping_text, waiting_for
from interlock.core.retryafter import retry_wait
from interlock.core.state import RunState, encode_state, evolve


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(record: ev.AnyRecord) -> str:
    """``time  seq  what happened``."""
    seq = record.id.rsplit(":", 1)[-1]
    what = _what_dag(record) or _what_held(record) or _what(record)
    return f"{record.time}  #{seq:>3}  {what}"


def _what_dag(r: ev.AnyRecord) -> str | None:
    """A DAG state's records, and the name of the step an action belongs to."""
    if isinstance(r, ev.DagStarted):
        d = r.data
        return (
            f"dag started      {d.state}: {', '.join(d.steps)} "
            f"(parallelism {d.parallelism}, completion {d.completion})"
        )
    if isinstance(r, ev.StepSkipped):
        return f"step skipped     {r.data.state}.{r.data.step}: {r.data.reason}"
    if isinstance(r, ev.DagCompleted):
        return f"dag completed    {r.data.state} result={_short(r.data.result)}"
    step = getattr(r.data, "step", None)
    if isinstance(r, ev.ActionRequested | ev.ActionCompleted | ev.ActionFailed) and step:
        return f"{_what(r)} [step {step}]"
    return None


def _what(r: ev.AnyRecord) -> str:
    if isinstance(r, ev.RunStarted):
        return _started(r.data)
    if isinstance(r, ev.StateEntered):
        return f"state entered    {r.data.state}"
    if isinstance(r, ev.ActionRequested):
        q = r.data
        what = f"workflow {q.workflow}" if q.workflow else q.capability
        item = f", item {q.item}" if q.item is not None else ""
        step = f", iteration {q.iteration}" if q.iteration is not None else ""
        admitted = ", admitted at once" if q.admitted_at is not None else ""
        return (
            f"action requested {what} (#{q.index}{item}{step}, attempt {q.attempt}{admitted}) "
            f"input={_short(q.input)}"
        )
    if isinstance(r, ev.ActionCompleted):
        c = r.data
        kind = "" if c.event_type == "task.completed" else f" as {c.event_type}"
        by = f" by {c.source}" if c.source else ""
        name = _action(c.state, c.index, c.item, c.iteration)
        return f"action completed {name}{kind}{by} result={_short(c.result)}"
    if isinstance(r, ev.ActionFailed):
        f = r.data
        name = _action(f.state, f.index, f.item, f.iteration)
        again = " (will retry)" if f.will_retry else ""
        message = plain_cel_error(f.error.message)
        return f"action failed    {name} {f.error.error_class}: {message}{again}"
    if isinstance(r, ev.ActionCancelled):
        a = r.data
        why = f": {a.reason}" if a.reason else ""
        held = stopping_text([a.freed] if a.freed else [])
        return f"action cancelled {a.action_id} in {a.state}{why}{held}"
    if isinstance(r, ev.MapStarted):
        m = r.data
        n = len(m.items)
        return (
            f"map started      {m.state} over {n} item{'s' if n != 1 else ''} "
            f"(parallelism {m.parallelism}, completion {m.completion})"
        )
    if isinstance(r, ev.MapCompleted):
        return f"map completed    {r.data.state} result={_short(r.data.result)}"
    if isinstance(r, ev.EventReceived):
        e = r.data.event
        return (
            f"event received   {e.get('type')} from {e.get('source')} data={_short(e.get('data'))}"
        )
    if isinstance(r, ev.GuardFailed):
        g = r.data
        return (
            f"guard failed     {g.state} on {g.event_type}: {g.guard!r}: {plain_cel_error(g.error)}"
        )
    if isinstance(r, ev.TransitionFired):
        t = r.data
        sets = f" set={_short(t.set)}" if t.set else ""
        errors = ", ".join(f"on[{i}]" for i in t.guard_errors)
        why = f" (decided by an error: the guard of {errors} failed)" if errors else ""
        return f"transition       {t.from_state} -> {t.to_state} on {t.event_type}{sets}{why}"
    if isinstance(r, ev.TimerScheduled):
        return f"timer scheduled  {r.data.purpose} at {r.data.fire_at}{retry_wait(r.data)}"
    if isinstance(r, ev.TimerFired):
        return f"timer fired      {r.data.timer_id}"
    if isinstance(r, ev.RunCompleted):
        return f"run completed    in {r.data.state} outputs={_short(r.data.outputs)}"
    if isinstance(r, ev.RunFailed):
        err = r.data.error
        return f"run failed       {err.error_class}: {plain_cel_error(err.message)}"
    if isinstance(r, ev.RunCancelled):
        return f"run cancelled    {r.data.reason}{stopping_text(r.data.freed)}"
    if isinstance(r, ev.RunForked):
        fork = r.data
        return (
            f"run forked       from {fork.origin_run_id} at #{fork.origin_seq}, "
            f"v{fork.version}, entering {fork.state} again"
        )
    if isinstance(r, ev.RunMigrated):
        return f"run migrated     v{r.data.from_version} -> v{r.data.version}"
    if isinstance(r, ev.RunContinued):
        return f"run continued    as {r.data.run_id} in {r.data.state} ({r.data.reason})"
    return _summarized(r)


def _summarized(r: ev.AnyRecord) -> str:
    """A queued or admitted run, a pause and what it holds; any other record by its type
    (``run.queued`` as ``run queued``)."""
    d: Any = r.data
    if isinstance(r, ev.RunQueued) and d.rate is not None:
        rate = d.rate
        rest = f"until {rate.until} by the rate of {rate.trigger} for key {rate.key!r}"
    elif isinstance(r, ev.RunQueued):
        rest = ", ".join(slot_text(c) for c in d.slots) or "for no slot (admitted next)"
    elif isinstance(r, ev.RunAdmitted):
        rest = admitted_text(d.limits)
    elif isinstance(r, ev.RunPaused):
        rest = ("with its workflow: " if d.workflow else "") + d.reason
    elif isinstance(r, ev.EventHeld):
        rest = f"{d.event.get('type')} id={d.event.get('id')} (decided on when resumed)"
    elif isinstance(r, ev.RunResumed):
        rest = f"{d.held} held event(s) decided on"
    else:
        rest = ""
    kind = ev.record_type(r).removeprefix(ev.PREFIX).replace(".", " ")
    return f"{kind:<16} {rest}".rstrip()


def _what_held(r: ev.AnyRecord) -> str | None:
    """A request held for its capability's limits or pause, and its admission."""
    if isinstance(r, ev.ActionQueued):
        w = r.data
        return f"action queued    {w.action_id} {waiting_for(w.limit, w.key)} (place {w.place})"
    if isinstance(r, ev.ActionAdmitted):
        deadline = f"; deadline {r.data.deadline}" if r.data.deadline else ""
        return f"action admitted  {r.data.action_id}, dispatched{deadline}"
    return None


def _started(d: ev.RunStartedData) -> str:
    on = "" if d.continued_from is None else f" continuing {d.continued_from.run_id}"
    return f"run started      {d.namespace}/{d.workflow} v{d.version}{on} inputs={_short(d.inputs)}"


def _action(state: str, index: int, item: int | None, iteration: int | None) -> str:
    """How the timeline names an action: ``review#0``; a map's items by their position
    (``count#2``); a loop's steps by iteration (``poll#0 iteration 3``)."""
    if item is not None:
        return f"{state}#{item}"
    if iteration is not None:
        return f"{state}#{index} iteration {iteration}"
    return f"{state}#{index}"


def _summary(state: RunState) -> dict[str, Any]:
    return {
        "status": state.status,
        "state": state.state,
        "context": state.context,
        "pending": sorted(state.pending),
        "outputs": state.outputs,
    }


def replay_lines(records: list[ev.AnyRecord], as_json: bool) -> Iterator[str]:
    """Fold ``records`` one at a time, yielding each step and the state after it."""
    state = RunState()
    for record in records:
        state = evolve(state, record)
        if as_json:
            yield json.dumps(
                {
                    "record": msgspec.to_builtins(record),
                    "state": json.loads(encode_state(state)),
                },
                sort_keys=True,
            )
        else:
            yield describe(record)
            yield f"{'':30}state: {_short(_summary(state), 200)}"
