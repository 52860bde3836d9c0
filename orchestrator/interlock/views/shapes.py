"""The shapes of :mod:`interlock.views`: one msgspec Struct per thing shown."""

from __future__ import annotations

from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.cel_text import plain_cel_error
from interlock.core.vocabulary import FINISHED
from interlock.views.chains import ChainView, HistoryView
from interlock.views.pauses import PauseView, WorkflowPause
from interlock.views.queueshape import QueueView as QueueView

TASK_EVENTS = frozenset({"task.completed", "task.failed"})
"""Transition events that an agent's answer (not an outside system) brings."""


class ErrorView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why an action or a run failed: its class (``timeout``, ``agent_error``...)."""

    error_class: str = msgspec.field(name="class")
    message: str
    code: str = ""

    def __post_init__(self) -> None:
        # Shown to people: an expression's error in CEL's words (the log keeps celpy's).
        msgspec.structs.force_setattr(self, "message", plain_cel_error(self.message))

    @classmethod
    def of(cls, error: ev.ErrorInfo | None) -> ErrorView | None:
        if error is None:
            return None
        return cls(error_class=error.error_class, message=error.message, code=error.code)


WAITING_KINDS = ("approval", "event", "agent", "workflow", "timer", "slot")
"""The kinds of :class:`WaitingOn`: what ``interlock runs --waiting`` and ``GET
/runs?waiting=`` filter by."""


class WaitingOn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One thing a running run's state waits for."""

    kind: str
    """``approval`` (an event a person sends: the state is ``human_in_the_loop``),
    ``event`` (an event from outside), ``agent`` (a capability's answer), ``workflow`` (a
    child run's end), ``timer`` (the state's timeout) or ``slot`` (a slot of a concurrency
    limit, before the run's first state)."""
    name: str
    """The event type, the capability, the child workflow, (a timer) the state its timeout
    goes to, or (a slot) the limit's name."""
    key: str = ""
    """(A slot) the key of the limit the run waits under (none for a workflow's pause)."""

    def matches(self, wanted: str) -> bool:
        """``wanted`` is this kind (``agent``), or this kind and name (``agent:review``)."""
        return wanted in (self.kind, f"{self.kind}:{self.name}")


class RunOrigin(msgspec.Struct, frozen=True, kw_only=True):
    """The run a forked run was copied from, and up to which record."""

    run_id: str
    seq: int
    started_at: str | None = None
    """When the origin started (the fork's own ``started_at`` is when it was forked)."""


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One line of a run list (``interlock runs``, ``GET /runs``)."""

    run_id: str
    workflow: str
    namespace: str = "default"
    version: int = 0
    status: str
    """``running``, ``completed``, ``failed``, ``cancelled`` or ``continued`` (its log
    ended and a new run goes on in its place: ``continued_to``)."""
    state: str = ""
    """The state the run is in (or ended in)."""
    started_at: str = ""
    updated_at: str = ""
    error: ErrorView | None = None
    waiting: list[WaitingOn] = []
    """What a running run's state waits for (from its workflow version's definition;
    empty once the run has ended or when that version is not stored)."""
    forked_from: RunOrigin | None = None
    """A forked run's origin."""
    migrated_from: int | None = None
    """The version a migrated run ran before it was moved to ``version``."""
    paused: PauseView | None = None
    """Set while the run is paused (it takes no transition until resumed)."""
    continued_from: str | None = None
    """The run this one continues (its log ended with ``run.continued`` naming this one)."""
    continued_to: str | None = None
    """The run that continues this one (status ``continued``)."""


class PendingActionView(msgspec.Struct, frozen=True, kw_only=True):
    """An action the run has asked for and not yet had answered."""

    action_id: str
    state: str
    capability: str
    """The capability asked (or ``workflow:<name>`` for a child workflow)."""
    attempt: int
    max_attempts: int
    requested_at: str
    deadline: str | None = None
    """When the attempt times out (None: no timeout)."""
    item: int | None = None
    """A map item's position."""
    iteration: int | None = None
    """A loop's iteration."""
    held: str | None = None
    """Not dispatched yet: what it waits for (its capability's limit, or its pause)."""


class WaitView(msgspec.Struct, frozen=True, kw_only=True):
    """A transition out of the current state: the event that takes it, its guard, where it
    goes."""

    event: str
    kind: str
    """``answer`` (an agent's answer: task.completed / task.failed), ``event`` (an event
    sent to the run: ``interlock signal``, or ``emit`` with a ``runid``), or ``correlated``
    (an event that reaches the run by its correlation key)."""
    goto: str
    guard: str | None = None
    """The CEL guard; the transition fires only when it is ``true``."""


class TimerView(msgspec.Struct, frozen=True, kw_only=True):
    timer_id: str
    purpose: str
    """``action-timeout``, ``retry``, ``state-timeout`` or ``run-deadline``."""
    fire_at: str
    state: str | None = None
    action_id: str | None = None


class GuardErrorView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A guard that failed to evaluate (``guard.failed``): it did not fire (fail-closed).
    ``taken``: the entry the run took instead (its position and state), when one was: the
    branch was decided by this error."""

    state: str
    transition: int
    event_type: str
    guard: str
    error: str
    time: str
    taken: int | None = None
    to_state: str | None = None

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "error", plain_cel_error(self.error))


class MapView(msgspec.Struct, frozen=True, kw_only=True):
    """A map state's progress."""

    items: int
    done: int
    failed: int
    parallelism: int
    completion: str


class SlotView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A concurrency slot a run needs: one of the ``size`` slots of ``limit`` for ``key``;
    ``holding`` it, or waiting at ``place`` in line (1: next), ``running`` runs holding
    one (``place`` and ``running`` are read from the orchestrator's slots, None where not
    known)."""

    limit: str
    key: str
    size: int
    holding: bool = False
    place: int | None = None
    running: int | None = None
    fair: str | None = None
    """The run's fairness key under a limit with ``fair``: ``place`` is then its place
    among that key's runs waiting (the keys share the slots), not in the whole line."""


class RunDescription(msgspec.Struct, frozen=True, kw_only=True):
    """Everything about one run now (``interlock describe run``, ``GET /runs/{id}``)."""

    run_id: str
    workflow: str
    namespace: str
    version: int
    spec_hash: str
    status: str
    state: str
    started_at: str
    """When the run started (a fork: when it was forked; ``forked_from`` has its
    origin's start)."""
    forked_from: RunOrigin | None = None
    """A forked run's origin, up to which record, and when the origin started."""
    updated_at: str
    finished_at: str | None = None
    records: int
    """How many records the run's log holds."""
    inputs: dict[str, Any] = {}
    context: dict[str, Any] = {}
    pending: list[PendingActionView] = []
    waiting_for: list[WaitView] = []
    """What the current state waits for (empty once the run has finished)."""
    timers: list[TimerView] = []
    map: MapView | None = None
    outputs: dict[str, Any] | None = None
    error: ErrorView | None = None
    reason: str | None = None
    """A cancelled run's reason."""
    correlation_key: str | None = None
    parent_run: str | None = None
    trigger: dict[str, Any] | None = None
    """The CloudEvent that started the run, when a trigger did."""
    guard_errors: list[GuardErrorView] = []
    """Every guard of the run that failed to evaluate, and what the run did instead."""
    warnings: list[str] = []
    """What reading the run's log found wrong: each message in it that is not a record
    Interlock wrote (a foreign message, skipped), where it is and why."""
    queued: bool = False
    """Waiting for its concurrency slots (``slots`` says where it stands)."""
    slots: list[SlotView] = []
    """The concurrency slots the run needs (none: its workflow declares no limit)."""
    window: ev.TriggerWindow | None = None
    """The window of events a debounced or batched trigger started the run with."""
    rate: ev.RateHold | None = None
    """While the run waits for its trigger's rate: until when, under which key."""
    paused: PauseView | None = None
    """Set while the run is paused: it takes no transition until resumed, and the events
    that reach it meanwhile are held (``held``) and decided on then."""
    chain: ChainView | None = None
    """Where the run stands in a chain of runs continued as new (None: in none)."""
    history: HistoryView | None = None
    """How long its log is beside its history limits."""


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ended, or that it has not (``interlock result``, ``GET /runs/{id}/result``)."""

    run_id: str
    status: str
    state: str = ""
    outputs: dict[str, Any] | None = None
    error: ErrorView | None = None
    reason: str | None = None
    """A cancelled run's reason."""
    finished_at: str | None = None
    chain: list[str] = []
    """When the run asked for continued as new: the runs followed, from it to ``run_id``,
    the run whose end (or progress) this is; empty otherwise."""

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class CapabilityView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    timeout_s: float | None = None
    max_retries: int | None = None
    workers: int = 0
    """Live workers serving it."""
    queued: int | None = None
    """Task requests waiting for a worker (None: its queue is not there yet)."""
    in_progress: int | None = None
    """Task requests delivered to a worker and not yet acknowledged."""


class WorkerView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    instance: str
    capabilities: list[str] = []
    pid: int | None = None
    host: str | None = None
    in_flight: int | None = None
    concurrency: int | None = None
    started_at: str | None = None
    heartbeat_at: str | None = None


class AgentView(msgspec.Struct, frozen=True, kw_only=True):
    """An AgentDef and the live workers of its capabilities."""

    name: str
    capabilities: list[CapabilityView] = []
    workers: list[WorkerView] = []
    spec: dict[str, Any] = {}


class WorkflowSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow's newest version (``interlock workflows``, ``GET /workflows``)."""

    namespace: str
    name: str
    version: int
    spec_hash: str = ""
    description: str | None = None
    triggers: list[str] = []
    """The event types that start it."""
    paused: WorkflowPause | None = None
    """Set while it is paused (its new runs wait)."""


class TransitionView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One way out of a state, for drawing the state machine: an ``on`` entry
    (``on[index]``), a ``catch`` of error classes or a state ``timeout`` (the run's
    deadline is not drawn: it leaves every state)."""

    from_state: str = msgspec.field(name="from")
    to_state: str = msgspec.field(name="to")
    kind: str
    """``on``, ``catch`` or ``timeout``."""
    event: str = ""
    """The event an ``on`` entry waits for; the error classes of a ``catch``."""
    guard: str | None = None
    index: int | None = None
    """An ``on`` entry's position in its state (``transition`` in the log's records)."""


class WorkflowDetail(msgspec.Struct, frozen=True, kw_only=True):
    """One workflow: its versions and the newest manifest (``interlock get workflow``)."""

    namespace: str
    name: str
    version: int
    versions: list[int]
    spec_hash: str = ""
    description: str | None = None
    triggers: list[str] = []
    inputs: dict[str, Any] = {}
    states: list[str] = []
    initial_state: str = ""
    manifest: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    """Each state's kind (``task``, ``terminal``, ``human_in_the_loop``, ``map``...)."""
    transitions: list[TransitionView] = []
    """Every way from one state to another (what a diagram draws)."""
    source: str | None = None
    """The manifest as it was applied, comments and all (None: applied before sources
    were kept, or not written as text)."""
    paused: WorkflowPause | None = None
    """Set while it is paused (its new runs wait)."""
    runs: list[VersionRuns] = []
    """How many runs of each version the run index holds, by status (``GET
    /workflows/...`` counts them; the client leaves it empty: ``runs(workflow=)`` lists
    them)."""


class VersionRuns(msgspec.Struct, frozen=True, kw_only=True):
    """The runs of one version of a workflow, by status."""

    version: int
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    continued: int = 0
    """Runs whose log ended in ``run.continued`` (their chain goes on in a newer run)."""


class DeadLetterView(msgspec.Struct, frozen=True, kw_only=True):
    """A message that could not be handled, with why (``interlock dead-letters``)."""

    seq: int
    time: str
    reason: str
    detail: str
    subject: str
    """Where it was first published (a redrive publishes it there again)."""
    headers: dict[str, str] = {}
    data: Any = None
    """The message's data: JSON when it is JSON, else text when it is UTF-8."""
    data_base64: str | None = None
    """The message's data when it is neither JSON nor UTF-8 text."""
    redrive_refusal: str | None = None
    """Why ``redrive`` refuses it (an agent wrote it, an answer or a timer, only the
    start of the message kept, ...); None when it may be redriven."""
