"""What an event sent from outside (``interlock emit``, ``POST /events``) or to one run
(``interlock signal``) did: the runs it started or reached, and what the run did with it."""

from __future__ import annotations

import msgspec

from interlock.core.vocabulary import RunStatus


class StartedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run an emitted event starts (or had started before: ``existed``)."""

    run_id: str
    workflow: str
    namespace: str = "default"
    version: int = 0
    existed: bool = False
    """The event was seen before: the run it started then is the one named."""
    pending: bool = False
    """Not in the log yet when ``emit`` answered: no orchestrator had taken the event (is
    one running?). It starts when one does."""


class EventRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow that takes an emitted event but cannot use it: the orchestrator
    dead-letters the event with ``reason`` (``bad-trigger-input``: its trigger's ``input``
    could not be rendered; ``invalid-inputs``: they break the workflow's inputs;
    ``bad-correlation-key``: its correlation key could not be computed)."""

    workflow: str
    namespace: str = "default"
    reason: str
    detail: str


class EmitResult(msgspec.Struct, frozen=True, kw_only=True):
    """What publishing an event did: the runs it starts, the runs it reaches by their
    correlation key, the workflows that dead-letter it, or nothing."""

    id: str
    type: str
    source: str
    seq: int
    """The event's sequence in the events stream."""
    duplicate: bool = False
    """An event with this source and id was published before; this one was dropped."""
    started: list[StartedRun] = []
    """The runs its triggers start (worked out with the orchestrator's own rules)."""
    run_id: str | None = None
    """The run the event was addressed to (its ``runid`` extension), if any."""
    reached: list[str] = []
    """Runs waiting for it by a correlation key it carries: each decides on it."""
    parked: list[str] = []
    """Workflows (``namespace/name``) that correlate it but have no run of its key yet:
    the event is kept 15 minutes, offered to a run of that key that starts meanwhile."""
    refused: list[EventRefusal] = []
    """Workflows that take it and cannot use it: the event is dead-lettered for them."""
    gathered: list[str] = []
    """Debounced or batched triggers whose window for its key takes it
    (``<trigger>@<kind> <key>``): their run starts when the window closes."""
    unknown: str | None = None
    """Why what the event does could not be worked out (the credential may not read the
    workflows, say, as a publisher's may not): it was sent, and nothing more is known."""

    @property
    def matched(self) -> bool:
        """It starts a run, reaches one, or is kept for one."""
        taken = self.started or self.reached or self.parked or self.gathered
        return bool(taken) or self.run_id is not None


class GateView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An evidence gate checked (``gate.checked``): a DAG step's (``step``) or a state's."""

    state: str
    step: str = ""
    subject: str = ""
    proven: bool = False
    missing: list[str] = []
    """The predicates the evidence does not prove yet (empty when proven)."""


class SignalResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a run did with an event sent to it (``interlock signal``)."""

    run_id: str
    type: str
    id: str
    outcome: str
    """``moved`` (a transition fired), ``recorded`` (evidence, kept by the run: ``gates``
    says what each gate it was checked by proved), ``declined`` (the run took the event but
    no guard was true), ``held`` (the run is paused, or waits for the slots of the version
    it was migrated onto, and will take it: kept in its log, and decided on when it is
    resumed or admitted), ``not-waiting`` (the run's state does not wait for it:
    not sent),
    ``finished`` (the run has ended: not sent) or ``unanswered`` (sent, and no orchestrator
    took it in time)."""
    state: str = ""
    """The state the run was in when the event arrived."""
    status: str = RunStatus.RUNNING
    """The run's status when the event was sent (or refused)."""
    to_state: str | None = None
    guard_errors: list[str] = []
    """Guards that failed to evaluate (they count as false)."""
    waiting_for: list[str] = []
    """For ``not-waiting``: the events the state does wait for."""
    gates: list[GateView] = []
    """For evidence (``recorded``, or ``moved`` by it): the gates checked with it, each
    proven now (its step starts, its state passes) or still missing predicates."""
    after: str | None = None
    """The run's status once it decided on the event (``running``, or ``failed``,
    ``completed``, ``cancelled`` when that same decision ended it); None when it did not
    decide (not sent, or unanswered)."""
    error: str | None = None
    """When that decision failed the run: the failure, ``<class>: <message>``."""
    declined: list[str] = []
    """For ``declined``: each transition of the state on the event and why it did not
    fire (``on[0] approval.granted -> merge: `data.ok` was false``, or its guard's
    error)."""
    addressed: str | None = None
    """The run the event was sent for, when that run had continued as new: the event went
    to ``run_id``, the newest run of its chain."""
    continued_to: str | None = None
    """When the decision on the event continued the run as new: the run that goes on."""
    held_until: str | None = None
    """For ``held``: what the run waits for before it decides the event: ``resumed`` (it
    is paused) or ``admitted`` (migrated onto a limited version, it waits for its
    slots)."""
