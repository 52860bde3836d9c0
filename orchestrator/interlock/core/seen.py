"""What a run remembers of the external events it took: their source and id, so that a
redelivered event is not taken twice.

Only the last :data:`SEEN_KEPT` are kept. A redelivered event is one of the last few (a
consumer's redelivery, a parked event offered again, an event published twice), while a
set that grew with every event a run ever took would make each step of a long run cost
more (it is copied as the state changes) and its snapshot grow without bound.
"""

from __future__ import annotations

from typing import Any

SEEN_KEPT = 2048
"""External events a run remembers having taken, the newest."""


def event_key(source: str, event_id: str) -> str:
    """The idempotency key of a CloudEvent: its source and id together."""
    return f"{source} {event_id}"


def taken(seen: dict[str, None], event: dict[str, Any]) -> dict[str, None]:
    """``seen`` with the event's source+id added last, the oldest beyond SEEN_KEPT gone."""
    out = dict(seen)
    take(out, event)
    return out


def take(seen: dict[str, None], event: dict[str, Any]) -> None:
    """What :func:`taken` returns, made in ``seen`` itself: for a dict no one else holds
    (a fold's own copy), so that folding many events copies it once, not once each."""
    seen[event_key(str(event.get("source", "")), str(event.get("id", "")))] = None
    while len(seen) > SEEN_KEPT:
        del seen[next(iter(seen))]
