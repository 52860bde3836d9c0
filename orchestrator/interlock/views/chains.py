"""A run's place in a chain of runs continued as new, and its log beside its history
limits, as ``describe`` and the console show them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from interlock.core.history import in_force, near
from interlock.core.vocabulary import RunStatus

if TYPE_CHECKING:
    from interlock.core.state import RunState


class ChainView(msgspec.Struct, frozen=True, kw_only=True):
    """A run's place in a chain of runs continued as new."""

    link: int = 0
    """0 for the first run of the chain, then 1, 2..."""
    previous: str | None = None
    """The run this one continues."""
    next: str | None = None
    """The run that continues this one."""
    reason: str | None = None
    """Why the run before continued: ``transition``, ``history.max_records`` or ``...bytes``."""


class HistoryView(msgspec.Struct, frozen=True, kw_only=True):
    """How long the run's log is beside its history limits."""

    records: int
    bytes: int
    max_records: int | None = None
    max_bytes: int | None = None
    continue_as_new: str = "auto"
    suggested: bool = False
    """The log has reached 80% of a limit: continuing as new is suggested."""


def chain_view(state: RunState) -> ChainView | None:
    """Where the run stands in its chain of runs continued as new (None: in none)."""
    chain = state.chain
    if chain is None:
        return None
    return ChainView(
        link=chain.link, previous=chain.previous, next=chain.next, reason=chain.reason or None
    )


def history_view(state: RunState) -> HistoryView:
    """The run's log beside its history limits."""
    limits = in_force(state)
    return HistoryView(
        records=state.seq,
        bytes=state.size,
        max_records=limits.max_records,
        max_bytes=limits.max_bytes,
        continue_as_new=limits.continue_as_new,
        # Only a running run can still take the suggestion (one that continued, or ended,
        # has nothing left to continue).
        suggested=state.status == RunStatus.RUNNING and near(state) is not None,
    )
