"""The compiled form of flow-control limits (part of the Definition IR): a workflow's
concurrency limits on its runs, and a capability's concurrency and rate limits on the
requests made of it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interlock.core.expr import Expression

MAX_PRIORITY = 1_000_000
"""Priorities go from minus this to this."""
MAX_KEY_LENGTH = 256
"""The longest key a limit's expression may give (longer ones fail the run)."""


def key_text(value: Any) -> str:
    """The key a limit's expression gave, as text (structured values as canonical JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


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


CAPABILITY_LIMIT = "cap:"
"""How the names of capabilities' limits begin (no workflow limit's name can: those begin
with a namespace, a DNS label)."""


@dataclass(frozen=True, slots=True)
class CapacityDef:
    """A limit on the requests of one capability, per value of ``key`` (CEL over the
    action's rendered ``input``; None: one key for all): ``size`` at work at once
    (``per_s`` 0), or ``size`` dispatched per ``per_s`` seconds, ``burst`` at once."""

    name: str
    """``cap:<capability>`` (concurrency) or ``cap:<capability>:rate``."""
    size: int
    key: Expression | None = None
    per_s: float = 0.0
    burst: int = 1
    max_waiting: int = 0
    """The most requests that may wait in its line per key (0: as many as a line holds)."""

    @property
    def is_rate(self) -> bool:
        return self.per_s > 0


def capacity_names(capability: str) -> tuple[str, str]:
    """The names of a capability's concurrency limit and its rate limit."""
    return f"{CAPABILITY_LIMIT}{capability}", f"{CAPABILITY_LIMIT}{capability}:rate"
