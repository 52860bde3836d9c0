"""What a run that lives long records of its chain of runs continued as new: the history
limits it was started under, and what a continued run takes over from the one before."""

from __future__ import annotations

from typing import Any

import msgspec


class HistoryLimits(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The history limits a run was started under (its workflow's ``spec.history`` over
    the installation's): recorded, so a replay decides the same from the log alone."""

    max_records: int | None = None
    max_bytes: int | None = None
    continue_as_new: str = "auto"
    """A :class:`~interlock.core.vocabulary.ContinueMode`: ``auto`` or ``never``."""


class ContinuedFrom(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a run continued as new takes over from the run before it in its chain (its
    inputs, context, trigger, correlation key, parent and spawn budget are the fields of
    ``run.started`` themselves)."""

    run_id: str
    """The run before this one: its log ends with ``run.continued`` naming this run."""
    seq: int
    """The log position of that ``run.continued``."""
    state: str
    """The state this run enters first (after its slots, when its workflow limits it)."""
    reason: str = "transition"
    """``transition`` (a ``continue_as_new`` transition), ``history.max_records`` or
    ``history.max_bytes`` (the limit neared, ``continue_as_new: auto``)."""
    link: int = 1
    """The run's place in its chain: the first run is 0."""
    states: dict[str, dict[str, Any]] = {}
    """``states.<name>.output`` as the run before had them."""
    evidence: dict[str, dict[str, Any]] | None = None
    spent: dict[str, int] | None = None
    """The edge budgets spent so far in the chain."""
    cost: float | None = None
    """What the chain has spent so far (``budget.max_cost`` counts it whole)."""
    seen: list[str] = []
    """Source+id of the newest external events the chain took: a redelivered one is not
    taken again by this run."""
    deadline_at: str | None = None
    """When the run's deadline (``spec.deadline``, or its own) comes: unchanged by
    continuing."""
