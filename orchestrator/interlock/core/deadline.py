"""A run's own deadline, as it is given when the run starts (``interlock start
--deadline``, ``Client.start(..., deadline=)``, ``POST /runs``)."""

from __future__ import annotations

MAX_DEADLINE_S = 10 * 365 * 86400.0
"""The longest deadline a run may be started with (ten years)."""


def check_deadline(seconds: float) -> float:
    """A run's own deadline in seconds: a finite number from 0 to ten years, else
    TypeError (not a number) or ValueError saying so."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"a deadline is a number of seconds, not {seconds!r}")
    if not 0 <= seconds <= MAX_DEADLINE_S:  # NaN fails this too
        raise ValueError(f"a deadline is 0 to {MAX_DEADLINE_S:.0f} seconds, not {seconds!r}")
    return float(seconds)
