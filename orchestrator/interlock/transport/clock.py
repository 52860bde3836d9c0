"""The wall clock as RFC 3339 text, for the CloudEvents a process sends.

What ``format_time(datetime.now(UTC))`` gives (UTC, to the millisecond, ``Z``), with each
second's text made once: a worker dates every answer it sends.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

_second: list[tuple[int, str]] = [(-1, "")]
"""The last second asked for and its text up to the milliseconds (one tuple, read and
replaced whole)."""


def utc_now(ns: int | None = None) -> str:
    """Now (or ``ns`` nanoseconds since the epoch), as RFC 3339 text: UTC, to the
    millisecond, ``Z`` (``format_time`` of it)."""
    second, milli = divmod((time.time_ns() if ns is None else ns) // 1_000_000, 1000)
    last, prefix = _second[0]
    if second != last:
        prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _second[0] = (second, prefix)
    return f"{prefix}{milli:03d}Z"
