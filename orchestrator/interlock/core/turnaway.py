"""A capability's request turned away from a full line, as the core decides it. Pure.

A capability limit's line holds at most so many requests per key (its ``max_waiting``, or
what a line holds: :mod:`interlock.runtime.slotroom`). A request that finds its line full
is not put in it: its attempt fails, as an attempt the platform could not carry out does
(``platform_error``, retryable, code :data:`LINE_FULL`), so a retry policy tries it
again later and a ``catch`` or ``on: task.failed`` sees it as any other failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interlock.core import events as ev
from interlock.core.reactions import Reactions
from interlock.core.vocabulary import ErrorClass

if TYPE_CHECKING:
    from interlock.core.definition import Definition
    from interlock.core.state import RunState

LINE_FULL = "capacity_line_full"
"""The code of the failure of a request turned away from a full line."""


def line_full_message(limit: str, key: str, waiting: int, most: int) -> str:
    requests = "request waits" if waiting == 1 else "requests wait"
    return (
        f"the line of {limit} is full for key {key!r}: {waiting:,} {requests}, at most {most:,} may"
    )


def turned_away(
    definition: Definition,
    state: RunState,
    now: str,
    *,
    action_id: str,
    attempt: int,
    message: str,
) -> list[ev.AnyRecord]:
    """``action.failed`` of a request held for its capability's limits whose line is
    full (then a retry, a ``catch``, or the run's failure, as for any failure). Nothing for
    a request no longer held (admitted, ended), so deciding twice records nothing twice."""
    pending = state.pending.get(action_id)
    if pending is None or pending.attempt != attempt or state.finished or not pending.held:
        return []
    step = Reactions(definition, state, now)
    error = ev.ErrorInfo(
        error_class=ErrorClass.PLATFORM_ERROR, message=message, retryable=True, code=LINE_FULL
    )
    step.action_failed(pending, error, None)
    return step.out
