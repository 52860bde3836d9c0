"""A run's own records: started, queued for and admitted to its concurrency slots,
forked, migrated, paused and resumed, and ended (completed, failed, cancelled)."""

from __future__ import annotations

from typing import Any

import msgspec

from .base import PREFIX, ErrorInfo, Record, SpawnBudget
from .capacity import FreedSlots, SlotClaim

__all__ = ["SlotClaim"]  # defined beside the capability limits' records
from .chain import ContinuedFrom, HistoryLimits


class ParentRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The action of a parent run that a child run answers."""

    run_id: str
    action_id: str
    attempt: int = 1


class TriggerWindow(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The window of events a debounced or batched trigger started the run with."""

    kind: str
    """``debounce`` or ``batch``."""
    trigger: str
    """``<namespace>/<workflow>#trigger<n>``."""
    key: str
    count: int
    """Events the window took."""
    events: list[str] = []
    """Their CloudEvent ids, in the order they came (a debounce's last 100)."""
    opened_at: str
    """When its first event came."""
    closed_by: str
    """``period`` (a debounce's quiet period passed), ``max_wait``, ``max_events`` or
    ``size`` (a batch whose next event would not fit its run's inputs)."""


class RunStartedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    workflow: str
    namespace: str = "default"
    version: int = 1
    spec_hash: str
    inputs: dict[str, Any] = {}
    context: dict[str, Any] = {}
    trigger: dict[str, Any] | None = None
    """The CloudEvent that started the run (structured form), when a trigger did."""
    correlation_key: str | None = None
    """The run's correlation key (``correlate.key``), when the workflow declares one."""
    parent: ParentRef | None = None
    """Set on a child run: the parent's action that this run answers."""
    spawn: SpawnBudget | None = None
    """A child run's, or a run with spawn budgets (narrowed by its own)."""
    deadline_s: float | None = None
    """The deadline the run was started with (seconds from its start), over the
    workflow's ``spec.deadline.after``; 0: it ended at once, nothing asked for."""
    window: TriggerWindow | None = None
    """Set when a debounced or batched trigger started the run (``trigger`` is the
    window's last event)."""
    history: HistoryLimits | None = None
    """The history limits in force for the run (None: the defaults)."""
    continued_from: ContinuedFrom | None = None
    """Set on a run that continues another (``run.continued``): what it takes over."""


class RunCompletedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    outputs: dict[str, Any] = {}
    parent: ParentRef | None = None
    """Copied from the run's start: where a child run's end is reported."""
    spawns: int | None = None
    """Under a spawn allowance: what the run and its children spent (told to the parent)."""


class RunFailedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str | None = None
    error: ErrorInfo
    outputs: dict[str, Any] = {}
    """What a terminal state with ``fail`` returns with its failure."""
    parent: ParentRef | None = None
    """Copied from the run's start: where a child run's end is reported."""
    spawns: int | None = None
    """Under a spawn allowance: what the run and its children spent (told to the parent)."""


class RunCancelledData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str | None = None
    reason: str = ""
    cancelled_actions: list[str] = []
    """Actions in flight when the run was cancelled; their agents are told to stop."""
    parent: ParentRef | None = None
    """Copied from the run's start: where a child run's end is reported."""
    spawns: int | None = None
    """Under a spawn allowance: what the run and its children spent (told to the parent)."""
    freed: list[FreedSlots] = []
    """The capability limits' lines its requests were in: they leave them now."""


class RunForkedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The records before this one are a copy of another run's first ``origin_seq``
    records; from here the run goes on by itself, on the version named here."""

    origin_run_id: str
    origin_seq: int
    workflow: str
    namespace: str = "default"
    version: int = 1
    spec_hash: str
    state: str
    """The state the run was in at the fork point; it is entered again next."""


class RunMigratedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """From here the run goes on under another version of its workflow (its log so far
    agrees with that version)."""

    from_version: int
    from_spec_hash: str
    version: int
    spec_hash: str
    checked_through: int
    """The log position up to which a replay found the log to agree with ``version``."""
    freed: list[SlotClaim] = []
    """The concurrency slots the run held or waited for under the version it leaves that
    ``version`` does not ask for: given back (or its place in line left) once this record
    is read. The slots ``version`` adds are asked for by a ``run.queued`` after it."""


class RateHold(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run's trigger was over its ``rate``: the run starts at ``until``, its place in
    the trigger's line for ``key``."""

    trigger: str
    """``<namespace>/<workflow>#trigger<n>``."""
    key: str
    until: str
    limit: int
    per_s: float


class RunQueuedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run waits for a slot of each of its workflow's concurrency limits before it
    enters its first state (the orchestrator admits it when it holds them all); with
    ``rate``, first until the time its trigger's rate gave it (then a second
    ``run.queued``, without ``rate``, takes its slots)."""

    slots: list[SlotClaim]
    rate: RateHold | None = None
    state: str | None = None
    """A fork's: the state it goes on in once admitted (None: the workflow's first)."""
    holds: bool = False
    """A run migrated, in its state, onto a version that asks for slots it does not hold:
    it stays in its state and holds what reaches it (``event.held``, as a paused run does)
    until it is admitted; the held events are decided on after ``run.admitted``."""


class RunAdmittedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run holds a slot of each limit it waited for; its first state is entered next."""

    limits: list[str] = []


class RunStarted(Record, tag=PREFIX + "run.started", frozen=True):
    data: RunStartedData


class RunCompleted(Record, tag=PREFIX + "run.completed", frozen=True):
    data: RunCompletedData


class RunFailed(Record, tag=PREFIX + "run.failed", frozen=True):
    data: RunFailedData


class RunCancelled(Record, tag=PREFIX + "run.cancelled", frozen=True):
    data: RunCancelledData


class RunForked(Record, tag=PREFIX + "run.forked", frozen=True):
    data: RunForkedData


class RunMigrated(Record, tag=PREFIX + "run.migrated", frozen=True):
    data: RunMigratedData


class RunQueued(Record, tag=PREFIX + "run.queued", frozen=True):
    data: RunQueuedData


class RunAdmitted(Record, tag=PREFIX + "run.admitted", frozen=True):
    data: RunAdmittedData


class RunPausedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run takes no transition until it is resumed: the events that reach it meanwhile
    are kept (``event.held``) and decided on when it is."""

    reason: str = ""
    workflow: bool = False
    """Paused with its workflow (``pause workflow --runs``): resuming the workflow resumes
    it."""


class EventHeldData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    event: dict[str, Any]
    """A full copy of the CloudEvent (an answer, a due timer, an external event) that
    reached the paused run, to be decided on once it is resumed."""


class RunResumedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run goes on; the events held while it was paused are decided on next, in the
    order they came (their records follow this one)."""

    held: int = 0


class RunPause(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A paused run's pause, in its state: since when, why, and the events held."""

    at: str
    reason: str = ""
    workflow: bool = False
    held: list[dict[str, Any]] = []


class RunPaused(Record, tag=PREFIX + "run.paused", frozen=True):
    data: RunPausedData


class EventHeld(Record, tag=PREFIX + "event.held", frozen=True):
    data: EventHeldData


class RunResumed(Record, tag=PREFIX + "run.resumed", frozen=True):
    data: RunResumedData


class RunContinuedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run's log ends here and the run goes on as ``run_id``, a new run that starts in
    ``state`` with the inputs, context and the rest it takes over (its ``run.started``
    names this run in ``continued_from``)."""

    run_id: str
    """The new run (derived from this run's id and this record's position)."""
    state: str
    inputs: dict[str, Any] = {}
    """The new run's inputs."""
    reason: str = "transition"
    """``transition``, ``history.max_records`` or ``history.max_bytes``."""
    records: int = 0
    """This run's records, this one included."""
    deadline_at: str | None = None
    """When the run's deadline comes: the new run's comes then too."""
    parent: ParentRef | None = None
    """Copied from the run's start: the new run answers the parent in its place."""


class RunContinued(Record, tag=PREFIX + "run.continued", frozen=True):
    data: RunContinuedData
