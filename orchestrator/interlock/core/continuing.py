"""Continue-as-new: a run's log ends (``run.continued``) and the run goes on as a new run
that takes over its inputs, context and the rest (``run.started.continued_from``). Pure.

The decision to continue is the engine's, in the records of a transition: a transition
with ``continue_as_new``, or any transition once the log nears its history limit under
``continue_as_new: auto`` (:mod:`interlock.core.history`). Starting the new run is the
shell's: it appends :func:`continuation`'s records to the new run's log, whose id derives
from the old run's and the position of its ``run.continued``, so starting it twice is
refused as existing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from interlock.core import events as ev
from interlock.core.vocabulary import TimerPurpose

if TYPE_CHECKING:
    from interlock.core.runstate import RunState

SEEN_CARRIED = 256
"""External events (source+id) a new run takes over from the run before it: the newest,
so that a redelivery of one the old run took is not taken again by the new one."""


def continued_run_id(run_id: str, seq: int) -> str:
    """The run that continues ``run_id`` from its ``run.continued`` at log position ``seq``."""
    return "n" + hashlib.sha256(f"{run_id}#continued#{seq}".encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Carried:
    """What a new run takes over, as :func:`interlock.core.engine.started` records it."""

    continued_from: ev.ContinuedFrom
    context: dict[str, Any]
    correlation_key: str | None
    trigger: dict[str, Any] | None


def carried(state: RunState, record: ev.RunContinued) -> Carried:
    """What the run after ``state`` (ended by ``record``) takes over from it."""
    seen = list(state.seen)[-SEEN_CARRIED:]
    link = 1 if state.chain is None else state.chain.link + 1
    return Carried(
        continued_from=ev.ContinuedFrom(
            run_id=state.run_id,
            seq=state.seq,
            state=record.data.state,
            reason=record.data.reason,
            link=link,
            states=dict(state.states),
            evidence=state.evidence,
            spent=state.spent,
            cost=state.cost,
            seen=seen,
            deadline_at=record.data.deadline_at,
        ),
        context=dict(state.context),
        correlation_key=state.correlation_key,
        trigger=state.trigger,
    )


def handed_spawn(state: RunState) -> ev.SpawnBudget | None:
    """The spawn budget a new run takes over: the same place in the tree, what is left
    of the allowance (child runs in flight were cancelled with the transition, so what
    was reserved for them stays spent)."""
    spawn = state.spawn
    if spawn is None:
        return None
    left = None if spawn.allowance is None else max(0, spawn.allowance - spawn.used)
    return ev.SpawnBudget(depth=spawn.depth, max_depth=spawn.max_depth, allowance=left)


def deadline_at(state: RunState) -> str | None:
    """When the run's deadline comes (None: it has none)."""
    return next(
        (t.fire_at for t in state.timers.values() if t.purpose == TimerPurpose.RUN_DEADLINE),
        None,
    )
