"""The compiled form of a workflow's concurrency limits (part of the Definition IR)."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.core.expr import Expression


@dataclass(frozen=True, slots=True)
class LimitDef:
    """A concurrency limit: ``size`` slots for each value of ``key`` (CEL over ``inputs``,
    ``event`` and ``data``), shared by every run that names the limit ``name``."""

    name: str
    """``<namespace>/<scope>``, or ``<namespace>/<workflow>#<n>`` (the n-th limit, from 1)."""
    key: Expression
    size: int
    on_limit: str = "queue"
    fair: Expression | None = None
    """Runs waiting are served in turn by this expression's value (None: in order)."""
    weight: Expression | None = None
    """The weight of a fairness key, an integer from 1 to :data:`MAX_WEIGHT` (None: 1)."""


MAX_WEIGHT = 1000
"""The heaviest weight a fairness key may have."""


@dataclass(frozen=True, slots=True)
class WindowDef:
    """A trigger's debounce or batch: its matching events are gathered per value of ``key``
    (CEL over ``event`` and ``data``; None: one window for the trigger) into a window that
    starts one run.

    Debounce (``kind`` ``debounce``): the window closes ``period_s`` after its last event,
    and at the latest ``max_wait_s`` after its first. Batch (``batch``): it closes at
    ``max_events`` events, or ``max_wait_s`` after its first."""

    kind: str
    key: Expression | None
    max_wait_s: float | None
    period_s: float = 0.0
    max_events: int = 0


@dataclass(frozen=True, slots=True)
class TriggerRateDef:
    """At most ``limit`` runs per ``per_s`` seconds for each value of ``key`` (None: one
    rate for the trigger); ``on_limit``: ``queue`` (they start later) or ``drop``."""

    limit: int
    per_s: float
    key: Expression | None = None
    on_limit: str = "queue"
