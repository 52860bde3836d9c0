"""RFC 3339 time, the text every record's ``time`` and every timer's ``fire_at`` carries.

Python 3.11's ``datetime.fromisoformat`` reads RFC 3339 as written (``Z`` included), so one
pair of helpers serves the whole tree. No clock is read here: the caller brings the time.
"""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp as a datetime (naive when the text has no offset).

    Raises ``ValueError`` when the text is not one."""
    return datetime.fromisoformat(text)


def format_time(moment: datetime, timespec: str = "milliseconds", *, utc: bool = True) -> str:
    """``moment`` as RFC 3339 text, milliseconds by default, UTC written as ``Z``.

    With ``utc`` (the default) the moment is converted to UTC first, a naive one being taken
    as UTC already; without, its own offset is kept (a CEL timestamp prints as it was given).
    """
    if utc:
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def since(value: str, now: datetime) -> str:
    """A lower bound on a record's time given as an RFC 3339 time (without an offset: UTC)
    or an age before ``now`` (``30s``, ``5m``, ``2h``, ``1d``), written as records write
    their times, so that the two compare as text.

    Raises:
        ValueError: ``value`` is neither.
    """
    import re
    from datetime import timedelta

    age = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", value.strip())
    if age is None:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{value!r}: give an RFC 3339 time (2026-01-02T15:04:05Z) "
                "or an age such as 30s, 5m, 2h, 1d"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
    else:
        unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[age.group(2)]
        moment = now - timedelta(seconds=float(age.group(1)) * unit)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
