"""The run log: every record is a CloudEvent 1.0, one msgspec Struct per type.

A record's ``type`` is its tag, so one decoder reads any record straight into the right
Struct. Evolving the schema: new fields get defaults, a field never changes type, and old
types stay readable (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

PREFIX = "io.interlock."
SOURCE = "interlock://orchestrator"


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A classified failure."""

    error_class: str = msgspec.field(name="class")
    """An :class:`~interlock.core.vocabulary.ErrorClass` (kept ``str`` in the log)."""
    message: str
    retryable: bool = False
    code: str = ""
    """A finer code the agent gave (``tool_error``, ``guardrail_denied``...), or the class it
    named that is not one of the error classes; guards read it as ``result.error.code``."""


# --- data payloads --------------------------------------------------------------------


class ParentRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The action of a parent run that a child run answers."""

    run_id: str
    action_id: str
    attempt: int = 1


class SpawnBudget(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A run's depth in its tree of runs (its actions are spawns at ``depth + 1``), the
    deepest spawn allowed (counted from the root) and the spawns it and its child runs may
    still make (see docs/language.md, spawn budgets)."""

    depth: int = 0
    max_depth: int | None = None
    allowance: int | None = None


class RetryInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    max_attempts: int = 1
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 60.0
    jitter: bool = True
    errors: list[str] = []
    """Error classes retried too, though not retryable (``*``: any failure)."""


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


class StateEnteredData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str


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


class ActionCancelledData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    action_id: str
    state: str
    reason: str = ""
    workflow: str | None = None


class MapStartedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    items: list[Any] = []
    parallelism: int = 1
    completion: str = "all"
    at_least: int = 0
    """For ``completion: at_least`` (a quorum): how many distinct producers must answer."""


class MapCompletedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    result: Any = None
    """``all``: the outputs in input order; ``any``: the first successful output."""


class DagStartedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A DAG state began: its steps (in an order where each follows those it depends on)
    run as soon as what they depend on allows, at most ``parallelism`` at once."""

    state: str
    steps: list[str] = []
    parallelism: int = 1
    completion: str = "all"


class StepSkippedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A DAG step that will never run: a step it depends on ended otherwise than its edge
    asks (a branch not taken)."""

    state: str
    step: str
    reason: str = ""


class EvidenceRecordedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An evidence event arrived (one of the types the workflow's ``evidence.events``
    names): kept whatever state the run is in, so it counts whenever a gate is checked."""

    event: dict[str, Any]
    """A full copy of the CloudEvent; its data (``{subject: {predicate: value}}``) is
    merged into what the run has proven."""


class GateCheckedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An evidence gate was checked. A DAG step's (``step``): ``proven`` (the step starts
    now), or not (the step is held until evidence proves ``missing``). A state's, on the
    answer ``action_id`` that completed its actions: ``proven`` (the state passes), or not
    (the answer is refused and the action asked again, at the same attempt); a state's
    without actions, on the external event just received: not proven, it is not taken."""

    state: str
    step: str = ""
    subject: str
    proven: bool = False
    missing: list[str] = []
    action_id: str = ""


class DagCompletedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    result: Any = None
    """Each step by name: its ``status`` (completed, failed, skipped) and its ``output`` or
    ``error``."""


class EventReceivedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    event: dict[str, Any]
    """A full copy of the CloudEvent, so a replay never needs another stream."""


class GuardFailedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    transition: int
    event_type: str
    guard: str
    error: str


class TransitionFiredData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    from_state: str = msgspec.field(name="from")
    to_state: str = msgspec.field(name="to")
    event_type: str
    event_id: str | None = None
    transition: int = 0
    set: dict[str, Any] = {}
    budget: list[str] = []
    """The edge budgets (``spec.budget.edges``) this transition spent one of."""
    guard_errors: list[int] = []
    """The ``on`` entries before it (by position) whose guard failed to evaluate
    (``guard.failed``): they did not fire, so this one was taken because of an error."""


class TimerScheduledData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    timer_id: str
    purpose: str
    """A :class:`~interlock.core.vocabulary.TimerPurpose` (kept ``str`` in the log)."""
    fire_at: str
    state: str | None = None
    action_id: str | None = None
    attempt: int = 1
    index: int = 0
    item: int | None = None
    iteration: int | None = None
    retry: RetryInfo | None = None
    """For a ``retry`` timer: the policy to request the next attempt under."""
    step: str | None = None


class TimerFiredData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    timer_id: str
    purpose: str = ""


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


class SlotClaim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A slot a run must hold before its first state: one of the ``size`` slots of the
    concurrency limit ``limit`` for ``key``."""

    limit: str
    """The limit's name: ``<namespace>/<scope>``, or ``<namespace>/<workflow>#<n>`` for a
    limit of one workflow (its n-th, from 1)."""
    key: str
    size: int
    on_limit: str = "queue"
    """What a run does when no slot is free: ``queue``, ``skip`` or ``cancel-oldest``."""
    priority: int = 0
    """The run's ``spec.priority``: in line, higher goes first (then the earlier queued)."""
    fair: str = ""
    """The run's value of the limit's ``fair`` expression: the values take turns."""


class RunQueuedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run waits for a slot of each of its workflow's concurrency limits before it
    enters its first state (the orchestrator admits it when it holds them all)."""

    slots: list[SlotClaim]


class RunAdmittedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run holds a slot of each limit it waited for; its first state is entered next."""

    limits: list[str] = []


# --- envelopes ------------------------------------------------------------------------


class Record(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    """CloudEvent envelope of a run-log record (structured mode JSON).

    The required CloudEvent attributes have no defaults so that ``omit_defaults`` (which
    keeps optional attributes such as ``traceparent`` out of the JSON when unset) never
    drops them.
    """

    specversion: str
    id: str
    source: str
    subject: str
    """The run id."""
    time: str
    datacontenttype: str
    traceparent: str | None = None


class RunStarted(Record, tag=PREFIX + "run.started", frozen=True):
    data: RunStartedData


class StateEntered(Record, tag=PREFIX + "state.entered", frozen=True):
    data: StateEnteredData


class ActionRequested(Record, tag=PREFIX + "action.requested", frozen=True):
    data: ActionRequestedData


class ActionCompleted(Record, tag=PREFIX + "action.completed", frozen=True):
    data: ActionCompletedData


class ActionFailed(Record, tag=PREFIX + "action.failed", frozen=True):
    data: ActionFailedData


class ActionCancelled(Record, tag=PREFIX + "action.cancelled", frozen=True):
    data: ActionCancelledData


class MapStarted(Record, tag=PREFIX + "map.started", frozen=True):
    data: MapStartedData


class MapCompleted(Record, tag=PREFIX + "map.completed", frozen=True):
    data: MapCompletedData


class DagStarted(Record, tag=PREFIX + "dag.started", frozen=True):
    data: DagStartedData


class StepSkipped(Record, tag=PREFIX + "step.skipped", frozen=True):
    data: StepSkippedData


class DagCompleted(Record, tag=PREFIX + "dag.completed", frozen=True):
    data: DagCompletedData


class EvidenceRecorded(Record, tag=PREFIX + "evidence.recorded", frozen=True):
    data: EvidenceRecordedData


class GateChecked(Record, tag=PREFIX + "gate.checked", frozen=True):
    data: GateCheckedData


class EventReceived(Record, tag=PREFIX + "event.received", frozen=True):
    data: EventReceivedData


class GuardFailed(Record, tag=PREFIX + "guard.failed", frozen=True):
    data: GuardFailedData


class TransitionFired(Record, tag=PREFIX + "transition.fired", frozen=True):
    data: TransitionFiredData


class TimerScheduled(Record, tag=PREFIX + "timer.scheduled", frozen=True):
    data: TimerScheduledData


class TimerFired(Record, tag=PREFIX + "timer.fired", frozen=True):
    data: TimerFiredData


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


AnyRecord = (
    RunStarted
    | StateEntered
    | ActionRequested
    | ActionCompleted
    | ActionFailed
    | ActionCancelled
    | MapStarted
    | MapCompleted
    | EventReceived
    | GuardFailed
    | TransitionFired
    | TimerScheduled
    | TimerFired
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunForked
    | RunMigrated
    | DagStarted
    | StepSkipped
    | DagCompleted
    | EvidenceRecorded
    | GateChecked
    | RunQueued
    | RunAdmitted
)

RECORD_TYPES: tuple[type[Record], ...] = AnyRecord.__args__
TERMINAL_TYPES = frozenset(
    {PREFIX + "run.completed", PREFIX + "run.failed", PREFIX + "run.cancelled"}
)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyRecord)
_list_decoder = msgspec.json.Decoder(list[AnyRecord])


def record_type(record: Record) -> str:
    """The CloudEvent ``type`` of a record."""
    return type(record).__struct_config__.tag  # type: ignore[return-value]


def encode(record: Record) -> bytes:
    """Structured-mode CloudEvent JSON of one record."""
    return _encoder.encode(record)


def decode(data: bytes | str) -> AnyRecord:
    """Decode one record; raises ``msgspec.ValidationError`` naming what is wrong."""
    return _decoder.decode(data)


BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
"""How a decision's records are stored: one JetStream message holding a JSON array of them
(the CloudEvents JSON batch format), so the append is atomic by construction."""


def encode_batch(records: Sequence[Record]) -> bytes:
    """One JSON array of records (the CloudEvents batch format)."""
    return _encoder.encode(list(records))


def decode_batch(data: bytes | str) -> list[AnyRecord]:
    """Decode a stored batch; a single record (a JSON object) is accepted too."""
    stripped = data.lstrip()
    if stripped[:1] in (b"[", "["):
        return _list_decoder.decode(data)
    return [_decoder.decode(data)]


def decode_lines(data: bytes) -> list[AnyRecord]:
    """Decode a JSONL export (one record per line, blank lines ignored)."""
    return [_decoder.decode(line) for line in data.splitlines() if line.strip()]


def data_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of each record type (the catalogue in contracts/)."""
    out: dict[str, dict[str, Any]] = {}
    for cls in RECORD_TYPES:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str)
        schema: dict[str, Any] = msgspec.json.schema(cls)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["description"] = f"Run-log record {tag}"
        out[tag] = schema
    return out
