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
