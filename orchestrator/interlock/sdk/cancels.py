"""Cancel notices a worker remembers, so that a task cancelled while it still waited in the
work queue is answered ``cancelled`` without running its handler.

A notice names an action and, optionally, one attempt. A notice without an attempt stops
the attempts requested before it, not the retries after it: the orchestrator sends one
when an attempt times out, and then requests the next attempt under the same action id.
So it covers attempt 1 (always requested before any notice about its action) and any
attempt requested before the notice's time; both times come from the same run log.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from interlock.core import rfc3339

DEFAULT_CAPACITY = 4096
DEFAULT_TTL = 900.0


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 CloudEvent ``time`` as an aware datetime (UTC if it has no offset)."""
    if not text:
        return None
    try:
        moment = rfc3339.parse_time(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass(slots=True)
class _Entry:
    seen: float
    attempts: set[int] = field(default_factory=set)
    every: bool = False
    """An attempt-less notice was received."""
    before: datetime | None = None
    """The latest time of the attempt-less notices."""


class CancelMemory:
    """The recent cancel notices, by action id: at most ``capacity`` actions, each kept
    ``ttl`` seconds after its last notice (the oldest go first when full)."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        self.capacity = capacity
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, action_id: object) -> bool:
        """Whether a notice about ``action_id`` is remembered (expired or not)."""
        return action_id in self._entries

    def remember(self, action_id: str, attempt: int | None, issued: datetime | None) -> None:
        """Record a notice for ``action_id`` (one ``attempt``, or None for all attempts
        requested before ``issued``, the notice's time)."""
        now = self._clock()
        entry = self._entries.pop(action_id, None)
        if entry is None or self._expired(entry, now):
            entry = _Entry(now)
        entry.seen = now
        if attempt is None:
            entry.every = True
            if issued is not None and (entry.before is None or issued > entry.before):
                entry.before = issued
        else:
            entry.attempts.add(attempt)
        self._entries[action_id] = entry
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if len(self._entries) <= self.capacity and not self._expired(oldest, now):
                break
            self._entries.popitem(last=False)

    def covers(self, action_id: str, attempt: int, requested: datetime | None) -> bool:
        """Whether a remembered notice cancels this attempt of ``action_id``, requested at
        ``requested`` (the task's CloudEvent time)."""
        entry = self._entries.get(action_id)
        if entry is None:
            return False
        if self._expired(entry, self._clock()):
            del self._entries[action_id]
            return False
        if attempt in entry.attempts:
            return True
        if not entry.every:
            return False
        if attempt == 1:
            return True
        return requested is not None and entry.before is not None and requested < entry.before

    def _expired(self, entry: _Entry, now: float) -> bool:
        return now - entry.seen > self.ttl
