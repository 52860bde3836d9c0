"""Concurrency limits of runs, as the core decides them. Pure.

A run of a workflow that declares ``spec.concurrency`` starts queued: after
``run.started`` comes ``run.queued``, naming each slot it needs (the limit and the key its
inputs and trigger event give), and no state is entered. Whether a slot is free is not the
core's to know: the orchestrator keeps the holders of each limit (see
:mod:`interlock.runtime.concurrency`) and, once the run holds a slot of every limit, calls
:func:`admitted`, which records ``run.admitted`` and enters the first state. A queued run
takes no event; its deadline, if it has one, fails it (it never moves a queued run into a
state); cancelling it works as for any run. The slot is freed by the record that ends the
run, whatever ends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from interlock.core import events as ev
from interlock.core.expr import ExpressionError
from interlock.core.limitdef import MAX_KEY_LENGTH as MAX_KEY_LENGTH
from interlock.core.limitdef import MAX_PRIORITY as MAX_PRIORITY
from interlock.core.limitdef import MAX_WEIGHT, LimitDef
from interlock.core.limitdef import key_text as key_text
from interlock.core.pauses import pause_claim
from interlock.core.vocabulary import ErrorClass, TimerPurpose

if TYPE_CHECKING:
    from interlock.core.definition import Definition
    from interlock.core.incoming import Incoming
    from interlock.core.reactions import Reactions
    from interlock.core.state import RunState


_READS: dict[int, tuple[Definition, frozenset[str], tuple[list[ev.SlotClaim], str | None]]] = {}
"""Per definition (by identity): the variables its limits' expressions and its priority
read, and, when they read none, the claims they give (the same for every run)."""


def claims(
    definition: Definition, inputs: Mapping[str, Any], trigger: Incoming | None
) -> tuple[list[ev.SlotClaim], str | None]:
    """The slots a run with ``inputs`` (started by ``trigger``) needs, or why its keys
    cannot be computed. Limits whose keys read nothing (a key such as ``'"all"'``) give
    the same claims to every run: computed once per definition."""
    found = _READS.get(id(definition))
    if found is None or found[0] is not definition:
        if len(_READS) >= 1024:  # definitions compiled again over time
            _READS.clear()
        reads = _reads(definition)
        constant = _claims(definition, {}) if not reads else ([], None)
        found = _READS[id(definition)] = (definition, reads, constant)
    _, reads, constant = found
    if not reads:
        return list(constant[0]), constant[1]
    activation: dict[str, Any] = {}
    if "inputs" in reads:
        activation["inputs"] = dict(inputs)
    if "event" in reads:
        activation["event"] = {} if trigger is None else trigger.to_dict()
    if "data" in reads:
        activation["data"] = None if trigger is None else trigger.data
    return _claims(definition, activation)


def _reads(definition: Definition) -> frozenset[str]:
    """The variables the expressions :func:`claims` evaluates read."""
    expressions = [definition.priority] if definition.priority is not None else []
    for limit in definition.concurrency:
        expressions += [e for e in (limit.key, limit.fair, limit.weight) if e is not None]
    return frozenset(name for e in expressions for name in e.names)


def _claims(
    definition: Definition, activation: dict[str, Any]
) -> tuple[list[ev.SlotClaim], str | None]:
    priority, problem = _priority(definition, activation)
    if problem is not None:
        return [], problem
    out: list[ev.SlotClaim] = []
    for limit in definition.concurrency:
        try:
            key = key_text(limit.key.evaluate(activation))
        except ExpressionError as exc:
            return [], f"the key of concurrency limit {limit.name} cannot be computed: {exc}"
        fair = ""
        if limit.fair is not None:
            try:
                fair = key_text(limit.fair.evaluate(activation))
            except ExpressionError as exc:
                return [], f"the fairness key of limit {limit.name} cannot be computed: {exc}"
        weight, problem = _weight(limit, activation)
        if problem is not None:
            return [], problem
        for what, text in (("key", key), ("fairness key", fair)):
            if len(text) > MAX_KEY_LENGTH:
                return [], (
                    f"the {what} of concurrency limit {limit.name} is {len(text)} characters "
                    f"long (at most {MAX_KEY_LENGTH})"
                )
        out.append(
            ev.SlotClaim(
                limit=limit.name,
                key=key,
                size=limit.size,
                on_limit=limit.on_limit,
                priority=priority,
                fair=fair,
                weight=weight,
            )
        )
    return out, None


def _weight(limit: LimitDef, activation: dict[str, Any]) -> tuple[int, str | None]:
    """The weight of the run's fairness key (1 without ``weight``), or why it has none."""
    if limit.weight is None:
        return 1, None
    try:
        value = limit.weight.evaluate(activation)
    except ExpressionError as exc:
        return 1, f"the weight of concurrency limit {limit.name} cannot be computed: {exc}"
    if type(value) is not int or not 1 <= value <= MAX_WEIGHT:
        return 1, (
            f"the weight of concurrency limit {limit.name} is {key_text(value)[:64]}, not "
            f"an integer from 1 to {MAX_WEIGHT:,}"
        )
    return value, None


def _priority(definition: Definition, activation: dict[str, Any]) -> tuple[int, str | None]:
    """The run's priority (0 without ``spec.priority``), or why it cannot be computed."""
    if definition.priority is None:
        return 0, None
    try:
        value = definition.priority.evaluate(activation)
    except ExpressionError as exc:
        return 0, f"the priority cannot be computed: {exc}"
    if type(value) is not int or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        return 0, (
            f"the priority is {key_text(value)[:64]}, not an integer from "
            f"{-MAX_PRIORITY:,} to {MAX_PRIORITY:,}"
        )
    return value, None


def queue(
    step: Reactions,
    definition: Definition,
    inputs: Mapping[str, Any],
    trigger: Incoming | None,
    *,
    paused: bool = False,
    rate: ev.RateHold | None = None,
    enters: str | None = None,
    recorded: list[ev.SlotClaim] | None = None,
) -> None:
    """After ``run.started``: the run waits for its slots, and (``paused``: its workflow is
    paused) for its workflow's resumption; or fails, its keys unknown. ``rate``: first
    until the time its trigger's rate gave it (a timer). ``enters``: a fork's state, entered
    once admitted. ``recorded``: the slots as a recorded ``run.queued`` names them (a
    re-drive takes them as recorded, whatever ``definition`` declares)."""
    if recorded is not None:
        slots = list(recorded)
    else:
        slots, problem = claims(definition, inputs, trigger)
        if problem is not None:
            step.fail_run(ErrorClass.SCHEMA_ERROR, problem)
            return
    if paused and recorded is None:
        slots.insert(0, pause_claim(definition.namespace, definition.name))
    step.emit(ev.RunQueued, ev.RunQueuedData(slots=slots, rate=rate, state=enters))
    if rate is not None:
        step.schedule(TimerPurpose.RATE, rate.until)


def rate_passed(step: Reactions, state: RunState, timer: ev.TimerScheduledData) -> None:
    """A run held by its trigger's rate reached its time: on to its slots (a second
    ``run.queued``, which the orchestrator admits at once when it needs none)."""
    step.emit(ev.TimerFired, ev.TimerFiredData(timer_id=timer.timer_id, purpose=timer.purpose))
    step.emit(ev.RunQueued, ev.RunQueuedData(slots=list(state.slots or [])))


def admitted(definition: Definition, state: RunState, now: str) -> list[ev.AnyRecord]:
    """A queued run holds all its slots: ``run.admitted``, then its first state entered.
    Nothing for a run that is not queued (admitted already, ended), so admitting twice
    records nothing twice. A run migrated in its state: ``run.admitted`` alone (the events
    it held are decided on after it: :func:`interlock.core.engine.admit` does both)."""
    return admitting(definition, state, now)[0]


def admitting(
    definition: Definition, state: RunState, now: str
) -> tuple[list[ev.AnyRecord], RunState]:
    """:func:`admitted`'s records with the run's state after them."""
    from interlock.core.reactions import Reactions

    if not state.queued or state.paused is not None:
        return [], state  # (a paused run is admitted when it is resumed)
    step = Reactions(definition, state, now)
    step.emit(ev.RunAdmitted, ev.RunAdmittedData(limits=[s.limit for s in state.slots or ()]))
    if state.waits is not None:
        return step.out, step.state
    chain = state.chain
    if state.enters is not None:
        step.enter(state.enters)  # a fork, where it was forked
    else:
        step.enter(chain.state if chain is not None and chain.state else definition.initial_state)
    return step.out, step.state


def deadline_while_queued(
    step: Reactions, timer: ev.TimerScheduledData, state: RunState | None = None
) -> None:
    """A timer of a queued run: its deadline fails the run; its trigger's rate lets it
    go on (``rate_passed``)."""
    if timer.purpose == TimerPurpose.RATE and state is not None:
        rate_passed(step, state, timer)
        return
    if timer.purpose != TimerPurpose.RUN_DEADLINE:
        return
    step.emit(ev.TimerFired, ev.TimerFiredData(timer_id=timer.timer_id, purpose=timer.purpose))
    step.fail_run(
        ErrorClass.TIMEOUT, "the run waited for a concurrency slot longer than its deadline"
    )
