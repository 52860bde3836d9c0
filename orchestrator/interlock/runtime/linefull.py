"""A request turned away from its capability limit's full line (``slotroom.crowded``): its
attempt failed in its run's log (:func:`interlock.core.turnaway.turned_away`), which the
run's retry policy, ``catch`` or ``on: task.failed`` then takes as any other failure."""

from __future__ import annotations

import logging
from collections.abc import Callable

from interlock.core import events as ev
from interlock.runtime.errors import UnknownRun, UnknownWorkflow
from interlock.runtime.runs import Runs
from interlock.runtime.slotroom import MAX_WAITING

log = logging.getLogger("interlock.capacity")


async def turn_away(
    runs: Runs,
    clock: Callable[[], str],
    request: tuple[str, str, int],
    claim: ev.SlotClaim,
    waiting: int,
) -> None:
    """Fail the attempt ``request`` (run id, action id, attempt) names: the line of
    ``claim`` is full, ``waiting`` requests in it."""
    from interlock.core.turnaway import line_full_message, turned_away  # the engine

    run_id, action_id, attempt = request
    most = min(claim.max_waiting or MAX_WAITING, max(waiting, 1))
    message = line_full_message(claim.limit, claim.key, waiting, most)
    now = clock()
    async with runs.locked(run_id):
        try:
            await runs.apply(
                run_id,
                lambda d, s: turned_away(
                    d, s, now, action_id=action_id, attempt=attempt, message=message
                ),
            )
        except (UnknownRun, UnknownWorkflow) as exc:
            log.warning("cannot turn %s of run %s away: %s", action_id, run_id, exc)
