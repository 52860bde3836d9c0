"""Chains of runs continued as new, on the orchestrator's side: the next run of a chain
started from its ``run.continued`` (an effect of that record, as a dispatch is of a
request), and the newest run of a chain found for what is addressed to an older one."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from interlock.core import events as ev
from interlock.core.incoming import TIMER_FIRED
from interlock.core.state import RunState, fold
from interlock.core.vocabulary import RunStatus
from interlock.runtime.errors import UnknownWorkflow
from interlock.runtime.runs import Decided, Opening, Runs

if TYPE_CHECKING:
    from interlock.core.definition import Definition
    from interlock.core.incoming import Incoming

log = logging.getLogger("interlock.flow")

CHAIN_HOPS = 100_000
"""The most runs of a chain followed to its newest (a bound: a chain is a list)."""


async def newest(runs: Runs, run_id: str) -> str:
    """The run that goes on for ``run_id``: itself, or, when it continued as new, the
    newest run of its chain (one whose log has not continued, or is not there yet)."""
    for _ in range(CHAIN_HOPS):
        entry = await runs.load(run_id)
        chain = None if entry is None else entry.state.chain
        if entry is None or entry.state.status != RunStatus.CONTINUED or chain is None:
            return run_id
        if chain.next is None:
            return run_id
        run_id = chain.next
    return run_id


async def forward(
    runs: Runs,
    run_id: str,
    incoming: Incoming,
    deliver: Callable[[str, Incoming], Awaitable[bool]],
) -> bool:
    """An event the run did not take, for a run that continued as new: delivered to the
    newest run of its chain (False: the run did not continue, or the event is an answer
    or a timer, which belong to the run they name: nothing delivered)."""
    if incoming.type == TIMER_FIRED or "actionid" in incoming.extensions:
        return False
    last = await newest(runs, run_id)
    return False if last == run_id else await deliver(last, incoming)


async def start_next(
    runs: Runs, record: ev.RunContinued, paused: Callable[[str, str], bool]
) -> bool:
    """Start the run that continues the one whose log ended with ``record``, on the same
    version; False when it exists already (started before a crash, or by another
    replica: its id derives from the old run's, so it is never started twice).
    ``paused(namespace, workflow)``: whether the workflow is paused (the run then waits)."""
    entry = runs.cached(record.subject)
    if entry is None or entry.state.seq < record.data.records:
        entry = await runs.load(record.subject, fresh=True)
    if entry is None:
        return False
    definition, state = entry.definition, entry.state
    held = paused(state.namespace, state.workflow)
    try:
        out = await _continuation(runs, definition, state, record, held)
        created, _ = await runs.open(Opening(record.data.run_id, definition, out))
    except UnknownWorkflow as exc:
        log.warning(
            "cannot start run %s continuing %s: %s", record.data.run_id, record.subject, exc
        )
        return False
    if created:
        log.info(
            "run %s continued as %s (%s)", record.subject, record.data.run_id, record.data.reason
        )
    return created


async def _continuation(
    runs: Runs, definition: Definition, state: RunState, record: ev.RunContinued, held: bool
) -> Decided:
    """The first records of the run ``record`` starts, decided on the values the old run's
    references name (its state, and the inputs ``record`` holds) and stored, as any
    decision's, under the new run's name: the new run's log references only its own
    objects, which go with it, and never a payload over the threshold."""
    from interlock.core.engine import continuation

    payloads = runs.payloads
    if payloads is not None:
        state = await payloads.state(state)
        inputs = await payloads.value(record.data.inputs, "inputs")
        if inputs is not record.data.inputs:
            data = msgspec.structs.replace(record.data, inputs=inputs)
            record = msgspec.structs.replace(record, data=data)
    out = Decided(*continuation(definition, state, record, paused=held))
    if payloads is not None:
        stored = await payloads.records(out.records)
        if stored is not None:
            out = Decided(stored, fold(stored))
    return out
