"""A run log for people: one line per record, and the state after each step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.state import RunState, encode_state, evolve


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(record: ev.AnyRecord) -> str:
    """``time  seq  what happened``."""
    seq = record.id.rsplit(":", 1)[-1]
    return f"{record.time}  #{seq:>3}  {_what(record)}"


def _what(r: ev.AnyRecord) -> str:
    if isinstance(r, ev.RunStarted):
        d = r.data
        return f"run started      {d.namespace}/{d.workflow} v{d.version} inputs={_short(d.inputs)}"
    if isinstance(r, ev.StateEntered):
        return f"state entered    {r.data.state}"
    if isinstance(r, ev.ActionRequested):
        q = r.data
        return (
            f"action requested {q.capability} (#{q.index}, attempt {q.attempt}) "
            f"input={_short(q.input)}"
        )
    if isinstance(r, ev.ActionCompleted):
        c = r.data
        kind = "" if c.event_type == "task.completed" else f" as {c.event_type}"
        by = f" by {c.source}" if c.source else ""
        return f"action completed {c.state}#{c.index}{kind}{by} result={_short(c.result)}"
    if isinstance(r, ev.ActionFailed):
        f = r.data
        return f"action failed    {f.state}#{f.index} {f.error.error_class}: {f.error.message}"
    if isinstance(r, ev.EventReceived):
        e = r.data.event
        return (
            f"event received   {e.get('type')} from {e.get('source')} data={_short(e.get('data'))}"
        )
    if isinstance(r, ev.GuardFailed):
        g = r.data
        return f"guard failed     {g.state} on {g.event_type}: {g.guard!r}: {g.error}"
    if isinstance(r, ev.TransitionFired):
        t = r.data
        sets = f" set={_short(t.set)}" if t.set else ""
        return f"transition       {t.from_state} -> {t.to_state} on {t.event_type}{sets}"
    if isinstance(r, ev.TimerScheduled):
        return f"timer scheduled  {r.data.purpose} at {r.data.fire_at}"
    if isinstance(r, ev.TimerFired):
        return f"timer fired      {r.data.timer_id}"
    if isinstance(r, ev.RunCompleted):
        return f"run completed    in {r.data.state} outputs={_short(r.data.outputs)}"
    if isinstance(r, ev.RunFailed):
        err = r.data.error
        return f"run failed       {err.error_class}: {err.message}"
    if isinstance(r, ev.RunCancelled):
        return f"run cancelled    {r.data.reason}"
    if isinstance(r, ev.RunForked):
        fork = r.data
        return (
            f"run forked       from {fork.origin_run_id} at #{fork.origin_seq}, "
            f"v{fork.version}, entering {fork.state} again"
        )
    if isinstance(r, ev.RunMigrated):
        return f"run migrated     v{r.data.from_version} -> v{r.data.version}"
    return ev.record_type(r)


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
