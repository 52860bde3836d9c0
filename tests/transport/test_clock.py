"""The shell's clock: RFC 3339 UTC text to the millisecond, as datetime formats it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from interlock.core.rfc3339 import parse_time
from interlock.transport import clock
from interlock.transport.clock import utc_now

_SHAPE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _datetime_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def test_the_clock_reads_as_datetime_formats_now_and_never_goes_back() -> None:
    seen = []
    for _ in range(5_000):  # many milliseconds' texts, most read more than once
        before = _datetime_now()
        now = utc_now()
        after = _datetime_now()
        assert _SHAPE.fullmatch(now), now
        # Between the two readings around it (a millisecond of rounding apart at most).
        slack = timedelta(milliseconds=1)
        assert parse_time(before) - slack <= parse_time(now) <= parse_time(after) + slack
        seen.append(now)
    assert seen == sorted(seen)
    assert len(set(seen)) > 1


def test_each_millisecond_reads_as_datetime_formats_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Across seconds, minutes and a year's end, read in order and out of order."""
    start = int(datetime(2026, 12, 31, 23, 59, 58, tzinfo=UTC).timestamp() * 1_000)
    moments = [*range(start, start + 3_000, 7), start + 1_500, start, start + 999, start + 1_000]
    for ms in moments:
        ns = ms * 1_000_000 + 123_456
        monkeypatch.setattr(clock.time, "time_ns", lambda ns=ns: ns)
        expected = datetime.fromtimestamp(ms / 1_000, UTC).isoformat(timespec="milliseconds")
        assert utc_now() == expected[:-6] + "Z"
        assert utc_now() == expected[:-6] + "Z"  # the same millisecond, kept
