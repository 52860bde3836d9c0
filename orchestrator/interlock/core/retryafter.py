"""An agent's retry-after: the earliest time its failed action may be tried again.

A ``task.failed`` answer's ``error.retry_after`` is either a number of seconds (from the
answer's recording) or an RFC 3339 instant with an offset, as HTTP's ``Retry-After`` is a
number of seconds or a date. The next attempt goes at the later of the retry policy's
backoff and the retry-after, which is clamped to :data:`RETRY_AFTER_MAX_S`: an agent can
hold its action back, never indefinitely. Anything else (a negative or non-finite number,
a boolean, text that is no instant) is refused at the edge (``answer-retry-after``) and
ignored here, so an older log holding one still folds.
"""

from __future__ import annotations

import math
from datetime import UTC
from typing import Any

from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time

__all__ = ["RETRY_AFTER_MAX_S", "retry_after_problem", "retry_after_seconds", "retry_wait"]

RETRY_AFTER_MAX_S = 3600.0
"""The longest wait an agent's retry-after can impose: one hour."""


def retry_after_problem(value: Any) -> str | None:
    """What is wrong with a ``retry_after`` value, or ``None`` when it is one (or absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return f"retry_after must be seconds or an RFC 3339 instant, not {type(value).__name__}"
    if isinstance(value, str):
        try:
            moment = parse_time(value) if len(value) <= 40 else None
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None or "T" not in value.upper():
            return f"retry_after {value[:40]!r} is no RFC 3339 instant (with its offset)"
        return None
    if not math.isfinite(value) or value < 0:
        return f"retry_after {value!r} is not a finite, non-negative number of seconds"
    return None


def retry_after_seconds(value: Any, now: str) -> float | None:
    """The wait a valid ``retry_after`` asks for, counted from ``now`` (RFC 3339) and
    clamped to ``[0, RETRY_AFTER_MAX_S]``, in milliseconds; ``None`` when absent or
    invalid."""
    if value is None or retry_after_problem(value) is not None:
        return None
    if isinstance(value, str):
        start = parse_time(now)
        start = start if start.tzinfo is not None else start.replace(tzinfo=UTC)
        seconds = (parse_time(value) - start).total_seconds()
    else:
        seconds = float(value)
    return round(min(max(seconds, 0.0), RETRY_AFTER_MAX_S), 3)


def retry_wait(timer: ev.TimerScheduledData) -> str:
    """Why a retry timer fires when it does, when the agent's retry-after had a say (here,
    where the CLI's log lines read it without loading the engine)."""
    if timer.retry_after_s is None:
        return ""
    return (
        f" (the later of the backoff {timer.backoff_s or 0:g}s and the agent's "
        f"retry-after {timer.retry_after_s:g}s)"
    )
