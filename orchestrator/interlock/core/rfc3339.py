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
