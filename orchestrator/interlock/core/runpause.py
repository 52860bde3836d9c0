"""Pausing one run, as the core decides it. Pure.

``run.paused`` stops the run where it is: it takes no transition and requests no action
until ``run.resumed``. An event that reaches it meanwhile (an agent's answer, a due timer,
an external event or a signal) and that it would take is not decided on: it is kept in
the log as ``event.held`` (a full copy, like ``event.received``), and on resume the held
events are decided on in the order they came, their records following ``run.resumed``.
So a paused run loses nothing, and a crash while it is paused loses nothing either: what
it holds is in its log. Actions requested before the pause still go out; their answers
are held. A paused run can be cancelled, and its deadline, if it has one, still counts
(the timer is held, and decided on at the resume after what was held before it: the
deadline's ``goto``, or the run fails). A queued run that is paused is not admitted until
it is resumed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from interlock.core import events as ev
from interlock.core.incoming import Incoming
from interlock.core.vocabulary import RunStatus

if TYPE_CHECKING:
    from interlock.core.state import RunState

MAX_HELD = 1_000
"""The most events a paused run holds: past that, what reaches it is not taken (deciding
whether to hold one decides the held ones again, so a flood would cost their square)."""

_ENVELOPE = frozenset({"specversion", "id", "source", "type", "subject", "time", "data"})


def pause(state: RunState, *, reason: str, now: str, workflow: bool = False) -> list[ev.AnyRecord]:
    """``run.paused`` for a running run that is not paused; nothing otherwise."""
    if state.status != RunStatus.RUNNING or state.paused is not None:
        return []
    data = ev.RunPausedData(reason=reason, workflow=workflow)
    return [_record(ev.RunPaused, state, now, data)]


def resumed(state: RunState, now: str) -> ev.AnyRecord:
    """``run.resumed`` of a paused run (the held events are decided on after it)."""
    assert state.paused is not None
    return _record(ev.RunResumed, state, now, ev.RunResumedData(held=len(state.paused.held)))


def hold(state: RunState, event: Incoming, now: str) -> list[ev.AnyRecord]:
    """``event.held`` for an event a paused run would take; nothing for one it holds
    already (a redelivery)."""
    kept = event.to_dict()
    paused = state.paused or state.waits  # (a run waiting for its slots holds as well)
    assert paused is not None
    if any(_same(kept, other) for other in paused.held):
        return []
    return [_record(ev.EventHeld, state, now, ev.EventHeldData(event=kept))]


def incoming(event: dict[str, Any]) -> Incoming:
    """The incoming event a held copy was made of."""
    return Incoming(
        type=str(event.get("type", "")),
        source=str(event.get("source", "")),
        id=str(event.get("id", "")),
        data=event.get("data"),
        time=event.get("time"),
        subject=event.get("subject"),
        extensions={k: str(v) for k, v in event.items() if k not in _ENVELOPE},
    )


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("type", "source", "id", "actionid", "attempt"))


def _record(cls: type[ev.AnyRecord], state: RunState, now: str, data: Any) -> ev.AnyRecord:
    """One record appended after the state's last (its id, as every record's, derived)."""
    return cls(
        specversion="1.0",
        id=f"{state.run_id}:{state.seq + 1}",
        source=ev.SOURCE,
        subject=state.run_id,
        time=now,
        datacontenttype="application/json",
        data=data,
    )
