"""An action's records: requested of a capability (or a child workflow), then completed,
failed or cancelled."""

from __future__ import annotations

from typing import Any

import msgspec

from .base import PREFIX, ErrorInfo, Record, SpawnBudget
from .capacity import FreedSlots, SlotClaim


class RetryInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    max_attempts: int = 1
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 60.0
    jitter: bool = True
    errors: list[str] = []
    """Error classes retried too, though not retryable (``*``: any failure)."""


class ActionRequestedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    action_id: str
    state: str
    index: int
    capability: str
    input: Any = None
    attempt: int = 1
    timeout_s: float | None = None
    deadline: str | None = None
    retry: RetryInfo | None = None
    """The retry policy in force for this action (None: no retries)."""
    workflow: str | None = None
    """Set when the action runs a child workflow instead of a capability."""
    item: int | None = None
    """The item's position, for an action of a map state."""
    iteration: int | None = None
    """The iteration (1-based), for an action of a loop state."""
    step: str | None = None
    """The step's name, for an action of a DAG state."""
    spawn: SpawnBudget | None = None
    """For a ``workflow`` action: what the child run is handed (reserved until it ends)."""
    limits: list[SlotClaim] = []
    """Its capability's limits, the key its input gives each: the request waits for
    ``action.admitted`` (no deadline runs until then) before it is dispatched, unless
    ``admitted_at`` says it was admitted at once."""
    admitted_at: str | None = None
    """A request with ``limits`` admitted at once, in the append of this record, at this
    instant (RFC 3339): its slots and tokens were free and taken before the append. It
    is dispatched on this record, its ``deadline`` counted from then; no
    ``action.admitted`` follows (older logs record the same as an ``action.admitted``
    with ``at_once``)."""


class ActionCompletedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    action_id: str
    state: str
    index: int
    result: Any = None
    event_type: str = "task.completed"
    """The type the agent answered with: ``task.completed`` or its own (``review.approved``)."""
    event_id: str | None = None
    context_writes: dict[str, Any] = {}
    """What the action's ``output`` mapping wrote into the run context."""
    item: int | None = None
    iteration: int | None = None
    source: str | None = None
    """Who answered: the answer's CloudEvent ``source`` (a worker of the SDK says its name)."""
    step: str | None = None
    cost: float | None = None
    """What the answer reports it cost (its result's ``cost``), summed into the run's."""
    spawns: int | None = None
    """For a ``workflow`` action under a spawn allowance: the spawns its child run made."""
    freed: FreedSlots | None = None
    """The capability limits' lines the request was in: it leaves them now."""


class ActionFailedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    action_id: str
    state: str
    index: int
    error: ErrorInfo
    attempt: int = 1
    event_id: str | None = None
    item: int | None = None
    iteration: int | None = None
    will_retry: bool = False
    """True when another attempt follows (after a backoff timer)."""
    source: str | None = None
    """Who answered with the failure (None: a timeout or the platform, not an answer)."""
    step: str | None = None
    spawns: int | None = None
    """For a ``workflow`` action under a spawn allowance: the spawns its child run made."""
    freed: FreedSlots | None = None
    """The capability limits' lines the attempt was in: it leaves them now."""


class ActionCancelledData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    action_id: str
    state: str
    reason: str = ""
    workflow: str | None = None
    freed: FreedSlots | None = None
    """The capability limits' lines the request was in: it leaves them now."""


class ActionRequested(Record, tag=PREFIX + "action.requested", frozen=True):
    data: ActionRequestedData


class ActionCompleted(Record, tag=PREFIX + "action.completed", frozen=True):
    data: ActionCompletedData


class ActionFailed(Record, tag=PREFIX + "action.failed", frozen=True):
    data: ActionFailedData


class ActionCancelled(Record, tag=PREFIX + "action.cancelled", frozen=True):
    data: ActionCancelledData
