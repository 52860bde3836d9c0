"""Limits on the requests of a capability, as the core decides them. Pure.

An AgentDef capability may declare ``concurrency`` (at most N of its requests at work at
once per key) and ``rate`` (at most N dispatched per window per key); the keys are CEL over
the action's rendered input. A run asking for such an action records ``action.requested``
with ``limits``: each limit and the key its input gives. No deadline runs yet and nothing
is dispatched: the orchestrator keeps each limit's line (:mod:`interlock.runtime.capacity`)
and, once the request holds a slot and a token of each, calls :func:`admitted`, which
records ``action.admitted`` with the attempt's deadline, counted from then; the request is
dispatched on that record. A request that has to wait first gets ``action.queued``
(:func:`queued`), naming the limit and key it waits for, so the log says why it waits; so
does a request of a paused capability (limited or not), whose deadline is void until it
is admitted. The record that ends the attempt (completed, failed, cancelled; a cancelled
run's) names the lines it leaves (``freed``), and the orchestrator frees them on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.expr import ExpressionError
from interlock.core.limitdef import MAX_KEY_LENGTH, MAX_PRIORITY, key_text
from interlock.core.rfc3339 import parse_time
from interlock.core.step import Step, plus_seconds
from interlock.core.vocabulary import TimerPurpose

_encode = msgspec.json.Encoder().encode

if TYPE_CHECKING:
    from interlock.core.definition import ActionDef, Definition
    from interlock.core.state import PendingAction, RunState


def claims(
    action: ActionDef, payload: Any, activation: dict[str, Any]
) -> tuple[list[ev.SlotClaim], str | None]:
    """The lines a request of ``action`` with input ``payload`` joins (none when its
    capability declares no limit), or why they cannot be computed."""
    if not action.limits or action.workflow is not None:
        return [], None
    priority = 0
    if action.priority is not None:
        try:
            value = action.priority.evaluate(activation)
        except ExpressionError as exc:
            return [], f"the priority of an action of {action.capability} cannot be computed: {exc}"
        if type(value) is not int or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
            return [], (
                f"the priority of an action of {action.capability} is {key_text(value)[:64]}, "
                f"not an integer from {-MAX_PRIORITY:,} to {MAX_PRIORITY:,}"
            )
        priority = value
    out: list[ev.SlotClaim] = []
    for limit in action.limits:
        key = ""
        if limit.key is not None:
            try:
                key = key_text(limit.key.evaluate({"input": payload}))
            except ExpressionError as exc:
                return [], f"the key of {limit.name}'s limit cannot be computed: {exc}"
        if len(key) > MAX_KEY_LENGTH:
            return [], (
                f"the key of {limit.name}'s limit is {len(key)} characters long "
                f"(at most {MAX_KEY_LENGTH})"
            )
        out.append(
            ev.SlotClaim(
                limit=limit.name,
                key=key,
                size=limit.size,
                priority=priority,
                per_s=limit.per_s,
                burst=limit.burst if limit.is_rate else 0,
                max_waiting=limit.max_waiting,
            )
        )
    return out, None


def _waiting(state: RunState, action_id: str, attempt: int) -> PendingAction | None:
    pending = state.pending.get(action_id)
    if pending is None or pending.attempt != attempt or state.finished:
        return None
    return pending


def queued(
    definition: Definition,
    state: RunState,
    now: str,
    *,
    action_id: str,
    attempt: int,
    limit: str,
    key: str,
    place: int,
) -> list[ev.AnyRecord]:
    """``action.queued``: the request waits for ``limit``'s line for ``key``. Nothing
    for a request no longer pending, admitted already, or recorded waiting there."""
    pending = _waiting(state, action_id, attempt)
    if pending is None or (not pending.held and pending.limits):
        return []
    if pending.queued == limit:
        return []  # said so already
    timeout = pending.timeout_s
    if timeout is None and pending.deadline is not None and pending.requested_at:
        timeout = (parse_time(pending.deadline) - parse_time(pending.requested_at)).total_seconds()
    step = Step(definition, state, now)
    step.emit(
        ev.ActionQueued,
        ev.ActionQueuedData(
            action_id=action_id,
            attempt=attempt,
            capability=pending.capability,
            limit=limit,
            key=key,
            place=place,
            timeout_s=timeout,
        ),
    )
    return step.out


def admitted(
    definition: Definition,
    state: RunState,
    now: str,
    *,
    action_id: str,
    attempt: int,
    at_once: bool = False,
) -> list[ev.AnyRecord]:
    """``action.admitted``: the request holds all it waited for and goes out now, its
    deadline counted from ``now`` (and its timer scheduled). Nothing for a request that
    is not held (admitted already, ended), so admitting twice records nothing twice.
    ``at_once``: admitted in the append of its request, its slots and tokens taken first."""
    pending = _waiting(state, action_id, attempt)
    if pending is None or not pending.held:
        return []
    deadline = None if pending.timeout_s is None else plus_seconds(now, pending.timeout_s)
    step = Step(definition, state, now)
    step.emit(
        ev.ActionAdmitted,
        ev.ActionAdmittedData(
            action_id=action_id, attempt=attempt, deadline=deadline, at_once=at_once
        ),
    )
    _time_out(step, pending, deadline)
    return step.out


def _time_out(step: Step, pending: PendingAction, deadline: str | None) -> None:
    """The admitted attempt's timeout timer, if it has a deadline."""
    if deadline is not None:
        step.schedule(
            TimerPurpose.ACTION_TIMEOUT,
            deadline,
            state=pending.state,
            action_id=pending.action_id,
            attempt=pending.attempt,
            index=pending.index,
            item=pending.item,
            iteration=pending.iteration,
            step=pending.step,
        )


def admitted_at_once(
    definition: Definition,
    decided: tuple[Sequence[ev.AnyRecord], RunState],
    now: str,
    index: int,
) -> tuple[list[ev.AnyRecord], RunState] | None:
    """A decision's records (and the run's state after them, ``decided``) with the
    request ``records[index]`` admitted at once at ``now``, in the same append: the
    request carries ``admitted_at`` and its deadline, counted from ``now``, and its
    timeout timer follows the decision's records. None for a request not held (as
    :func:`admitted` records nothing). The state is the one the new records fold to,
    found without folding them again."""
    records, state = decided
    request = records[index]
    if not isinstance(request, ev.ActionRequested):
        return None
    d = request.data
    pending = _waiting(state, d.action_id, d.attempt)
    if pending is None or not pending.held or pending.queued:
        return None
    deadline = None if pending.timeout_s is None else plus_seconds(now, pending.timeout_s)
    admitted = replace(request, data=replace(d, admitted_at=now, deadline=deadline))
    grown = len(_encode(admitted)) - len(_encode(request))
    going = replace(pending, held=False, deadline=deadline)
    state = replace(state, pending={**state.pending, d.action_id: going}, size=state.size + grown)
    step = Step(definition, state, now)
    _time_out(step, going, deadline)
    return [*records[:index], admitted, *records[index + 1 :], *step.out], step.state


def again(
    definition: Definition,
    state: RunState,
    recorded: Iterable[ev.AnyRecord],
    ids: Mapping[str, str],
) -> list[ev.AnyRecord]:
    """The ``action.queued`` and ``action.admitted`` (with its timer) among ``recorded``
    (one decision's records, as another run's log has them), made again for the run
    ``state`` is of: where a re-drive takes the orchestrator's admission of a limited or
    paused capability's requests as recorded. ``ids``: the recorded action ids mapped
    to this run's, where they differ."""
    from interlock.core.state import fold

    out: list[ev.AnyRecord] = []
    for record in recorded:
        if isinstance(record, ev.ActionQueued):
            q = record.data
            new = queued(
                definition,
                state,
                record.time,
                action_id=ids.get(q.action_id, q.action_id),
                attempt=q.attempt,
                limit=q.limit,
                key=q.key,
                place=q.place,
            )
        elif isinstance(record, ev.ActionAdmitted):
            a = record.data
            new = admitted(
                definition,
                state,
                record.time,
                action_id=ids.get(a.action_id, a.action_id),
                attempt=a.attempt,
                at_once=a.at_once,
            )
        else:
            continue
        out += new
        state = fold(new, state)
    return out


def at_once_again(
    definition: Definition,
    decided: tuple[list[ev.AnyRecord], RunState],
    recorded: Iterable[ev.AnyRecord],
    ids: Mapping[str, str],
) -> tuple[list[ev.AnyRecord], RunState]:
    """A re-drive's records of one step (and the state after them, ``decided``) with the
    requests that ``recorded`` (the step as another run's log has it) shows admitted at
    once (``admitted_at``) admitted so again, at the recorded instant. ``ids``: as for
    :func:`again`."""
    records, state = decided
    for r in recorded:
        if not isinstance(r, ev.ActionRequested) or r.data.admitted_at is None:
            continue
        action_id = ids.get(r.data.action_id, r.data.action_id)
        for index, mine in enumerate(records):
            if (
                isinstance(mine, ev.ActionRequested)
                and mine.data.action_id == action_id
                and mine.data.attempt == r.data.attempt
            ):
                went = admitted_at_once(definition, (records, state), r.data.admitted_at, index)
                records, state = (records, state) if went is None else went
                break
    return records, state


def stopping(records: Iterable[ev.AnyRecord], action_id: str, attempt: int) -> ev.FreedSlots | None:
    """What the record that cancelled this attempt once dispatched frees, when it holds
    the attempt's slots while its worker stops (``stopping_until``); None otherwise."""
    for record in records:
        for slots in freed_by(record):
            if (slots.action_id, slots.attempt) == (action_id, attempt) and slots.stopping_until:
                return slots
    return None


def freed_by(record: ev.AnyRecord) -> list[ev.FreedSlots]:
    """The capability lines a record ends requests' places in."""
    if isinstance(record, ev.RunCancelled):
        return record.data.freed
    if isinstance(record, ev.ActionCompleted | ev.ActionFailed | ev.ActionCancelled):
        return [] if record.data.freed is None else [record.data.freed]
    return []
