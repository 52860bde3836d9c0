"""What moves a run from state to state: events received, guards that failed, the
transitions fired, and timers scheduled and fired."""

from __future__ import annotations

from typing import Any

import msgspec

from .actions import RetryInfo
from .base import PREFIX, Record


class EventReceivedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    event: dict[str, Any]
    """A full copy of the CloudEvent, so a replay never needs another stream."""


class GuardFailedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    transition: int
    event_type: str
    guard: str
    error: str


class TransitionFiredData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    from_state: str = msgspec.field(name="from")
    to_state: str = msgspec.field(name="to")
    event_type: str
    event_id: str | None = None
    transition: int = 0
    set: dict[str, Any] = {}
    budget: list[str] = []
    """The edge budgets (``spec.budget.edges``) this transition spent one of."""
    guard_errors: list[int] = []
    """The ``on`` entries before it (by position) whose guard failed to evaluate
    (``guard.failed``): they did not fire, so this one was taken because of an error."""


class TimerScheduledData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    timer_id: str
    purpose: str
    """A :class:`~interlock.core.vocabulary.TimerPurpose` (kept ``str`` in the log)."""
    fire_at: str
    state: str | None = None
    action_id: str | None = None
    attempt: int = 1
    index: int = 0
    item: int | None = None
    iteration: int | None = None
    retry: RetryInfo | None = None
    """For a ``retry`` timer: the policy to request the next attempt under."""
    step: str | None = None
    backoff_s: float | None = None
    """For a ``retry`` timer that an agent's retry-after set too: the retry policy's backoff
    (without one, the timer's wait is the backoff alone)."""
    retry_after_s: float | None = None
    """For a ``retry`` timer: the wait the agent's answer asked for, when it had one (the
    timer fires at the later of the two)."""


class TimerFiredData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    timer_id: str
    purpose: str = ""


class EventReceived(Record, tag=PREFIX + "event.received", frozen=True):
    data: EventReceivedData


class GuardFailed(Record, tag=PREFIX + "guard.failed", frozen=True):
    data: GuardFailedData


class TransitionFired(Record, tag=PREFIX + "transition.fired", frozen=True):
    data: TransitionFiredData


class TimerScheduled(Record, tag=PREFIX + "timer.scheduled", frozen=True):
    data: TimerScheduledData


class TimerFired(Record, tag=PREFIX + "timer.fired", frozen=True):
    data: TimerFiredData
