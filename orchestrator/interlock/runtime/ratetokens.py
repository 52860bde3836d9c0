"""A capability rate's tokens as its slots entry keeps them (GCRA), and the wake-up timer of
its line.

A rate entry keeps the limit's theoretical arrival time (``tat``): a token is there once
the clock reaches ``tat - (burst - 1) * per / limit``, and taking one moves ``tat`` on by
``per / limit`` (:mod:`capacity` takes them one at a time, :mod:`rateblocks` in blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interlock.runtime.slotlines import SlotEntry

RATE_ROUTE = "rate-"
"""How the run id a rate line's wake-up timer is routed by begins (the timer's id says
it is one: ``<route>:rate:<ms>``; a run's own timers are ``<run>:<position>``)."""
EPSILON_S = 1e-6


def is_rate_timer(run_id: str, timer_id: str) -> bool:
    return run_id.startswith(RATE_ROUTE) and timer_id.startswith(f"{run_id}:rate:")


def rate_route(token: str) -> str:
    """What a rate line's wake-up timer is routed by, for its entry's key."""
    return RATE_ROUTE + token.replace(".", "-", 1)


def rate_token(route: str) -> str:
    """The entry's key a rate line's wake-up timer is routed by."""
    return route.removeprefix(RATE_ROUTE).replace("-", ".", 1)


def interval(entry: SlotEntry) -> float:
    return entry.per_s / max(entry.size, 1)


def next_token_at(entry: SlotEntry) -> float:
    """When the rate's next token is there (seconds since the epoch)."""
    return entry.tat - (max(entry.burst, 1) - 1) * interval(entry)


def take_token(entry: SlotEntry, now: float) -> bool:
    """Take the rate's next token if it is there by ``now`` (``tat`` moved on)."""
    if now + EPSILON_S < next_token_at(entry):
        return False
    entry.tat = max(entry.tat, now) + interval(entry)
    return True
