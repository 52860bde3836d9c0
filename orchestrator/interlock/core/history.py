"""History limits: how long one run's log may grow before it is continued as a new run
(``continue_as_new: auto``) or fails (``never``). Pure: every value comes from the log
(the limits a run was started under are recorded on its ``run.started``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from interlock.core import events as ev
from interlock.core.vocabulary import SUGGESTED_SHARE, ContinueMode

if TYPE_CHECKING:  # the run state folds without the compiler's modules (read commands)
    from interlock.core.definition import Definition
    from interlock.core.state import RunState

DEFAULT_MAX_RECORDS: Final = 200_000
"""The records of one run's log, unless the workflow or the installation says otherwise."""
DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024
"""The bytes of one run's log (its records as encoded), unless said otherwise."""
DEFAULT: Final = ev.HistoryLimits(
    max_records=DEFAULT_MAX_RECORDS, max_bytes=DEFAULT_MAX_BYTES, continue_as_new="auto"
)
"""The limits of a run whose ``run.started`` records none."""
MIN_HISTORY_BYTES: Final = 16_384
"""The smallest ``max_bytes`` (a run's first records take a few KB)."""

MAX_RECORDS: Final = "history.max_records"
MAX_BYTES: Final = "history.max_bytes"
TRANSITION: Final = "transition"
"""Why a run continued as new (``run.continued``'s ``reason``): a limit neared, or a
``continue_as_new`` transition."""

_SIZE = re.compile(r"\s*(\d+)\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*")
_UNITS = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
}


def parse_size(text: str) -> int | None:
    """``64MiB`` as bytes (None: not a size)."""
    found = _SIZE.fullmatch(text)
    if found is None:
        return None
    return int(found.group(1)) * _UNITS[found.group(2)]


def limits(
    definition: Definition, installation: ev.HistoryLimits | None = None
) -> ev.HistoryLimits | None:
    """The limits a run of ``definition`` starts under: its ``spec.history``, each field
    it leaves unset from ``installation`` (else :data:`DEFAULT`). None when that is
    :data:`DEFAULT` itself, which a run that records no limits is under."""
    base = installation or DEFAULT
    own = definition.history
    if own is not None:
        base = ev.HistoryLimits(
            max_records=own.max_records or base.max_records,
            max_bytes=own.max_bytes or base.max_bytes,
            continue_as_new=own.continue_as_new or base.continue_as_new,
        )
    return None if base == DEFAULT else base


def in_force(state: RunState) -> ev.HistoryLimits:
    """The limits of a run, as its ``run.started`` recorded them."""
    return state.history or DEFAULT


def near(state: RunState) -> str | None:
    """The limit a run has reached :data:`SUGGESTED_SHARE` of, if any: continuing it as
    new is suggested (and done at its next transition, under ``auto``)."""
    h = in_force(state)
    if h.max_records is not None and state.seq >= h.max_records * SUGGESTED_SHARE:
        return MAX_RECORDS
    if h.max_bytes is not None and state.size >= h.max_bytes * SUGGESTED_SHARE:
        return MAX_BYTES
    return None


def over(state: RunState) -> str | None:
    """The limit a run's log has gone past, if any."""
    h = in_force(state)
    if h.max_records is not None and state.seq > h.max_records:
        return MAX_RECORDS
    if h.max_bytes is not None and state.size > h.max_bytes:
        return MAX_BYTES
    return None


def continues_by_itself(state: RunState) -> str | None:
    """Whether the run's next transition continues it as new (``auto``, a limit near):
    the reason, or None."""
    if in_force(state).continue_as_new != ContinueMode.AUTO:
        return None
    return near(state)


def exceeded_message(state: RunState, reason: str) -> str:
    """Why a run fails at its history limit (``history_exceeded``)."""
    h = in_force(state)
    limit = h.max_records if reason == MAX_RECORDS else h.max_bytes
    unit = "records" if reason == MAX_RECORDS else "bytes"
    if h.continue_as_new == ContinueMode.AUTO:
        how = (
            f"it took no transition since it reached {SUGGESTED_SHARE:.0%} of the limit, "
            "where it would have continued as new"
        )
    else:
        how = (
            "continue it as new: a transition with continue_as_new, or "
            "spec.history.continue_as_new: auto"
        )
    return f"the run's log would pass {reason} ({limit} {unit}): {how}"
