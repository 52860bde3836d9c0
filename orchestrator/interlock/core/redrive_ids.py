"""The new run's action and timer that stand for a recorded run's, when a re-drive's ids
have drifted from the recorded ones (:mod:`interlock.core.redrive`). Pure.

``ids`` remembers each recorded id found in the new run (it is filled as they are found).
"""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.state import RunState


def _pending_key(p: Any) -> tuple[Any, ...]:
    return (p.state, p.index, p.item, p.iteration)


def map_action(
    ids: dict[str, str], state: RunState, recorded: RunState, action_id: str
) -> str | None:
    """The new run's action that stands for a recorded one (same state, position, item)."""
    mapped = ids.get(action_id, action_id)
    old = recorded.pending.get(action_id)
    found = state.pending.get(mapped)
    if found is not None and (old is None or _pending_key(found) == _pending_key(old)):
        return mapped
    if old is None:
        return None
    for pending in state.pending.values():
        if _pending_key(pending) == _pending_key(old):
            ids[action_id] = pending.action_id
            return pending.action_id
    return None


def _timer_key(t: ev.TimerScheduledData) -> tuple[Any, ...]:
    return (t.purpose, t.state, t.index, t.item, t.iteration, t.attempt)


def map_timer(
    ids: dict[str, str], state: RunState, recorded: RunState, timer_id: str
) -> str | None:
    """The new run's timer that stands for a recorded one (same purpose, state, position
    and attempt, and set for the action that stands for the recorded timer's action)."""
    old = recorded.timers.get(timer_id)
    mapped = ids.get(timer_id, timer_id)
    found = state.timers.get(mapped)
    if found is not None and (old is None or _timer_key(found) == _timer_key(old)):
        return mapped
    if old is None:
        return None
    action_id = None
    if old.action_id is not None:
        # The action may not have been answered yet (a timeout): map it here.
        action_id = map_action(ids, state, recorded, old.action_id) or ids.get(
            old.action_id, old.action_id
        )
    for new in state.timers.values():
        if _timer_key(new) == _timer_key(old) and (
            old.action_id is None or new.action_id == action_id
        ):
            ids[timer_id] = new.timer_id
            return new.timer_id
    return None
