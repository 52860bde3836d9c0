"""The wall clock as RFC 3339 text, for the records and CloudEvents a process writes.

What ``format_time(datetime.now(UTC))`` gives (UTC, to the millisecond, ``Z``), with each
second's text made once and each millisecond's once: the orchestrator dates every
decision (several a millisecond are common under load), a worker every answer it sends.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


class _Now:
    """The millisecond and the second :func:`utc_now` formatted last, and their texts."""

    __slots__ = ("ms", "prefix", "second", "text")

    def __init__(self) -> None:
        self.ms = self.second = -1
        self.text = self.prefix = ""


_now = _Now()


def utc_now(ns: int | None = None) -> str:
    """Now (or ``ns`` nanoseconds since the epoch), as RFC 3339 text: UTC, to the
    millisecond, ``Z`` (``format_time`` of it)."""
    ms = (time.time_ns() if ns is None else ns) // 1_000_000
    last = _now
    if ms == last.ms:
        return last.text
    second, milli = divmod(ms, 1000)
    if second != last.second:
        last.second = second
        last.prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    last.ms, last.text = ms, f"{last.prefix}{milli:03d}Z"
    return last.text
