"""Stopping background tasks for sure.

A single ``task.cancel()`` followed by ``await task`` can wait forever: on Python 3.11,
``asyncio.wait_for`` (which nats-py's timed reads, KV watchers and requests use) drops a
cancellation that arrives just as the wait it guards completes, so the task carries on (a
loop goes round again) and the ``await`` never returns. :func:`cancel_and_wait` cancels
again until each task has ended. Loops that can also end on a stop flag should: the flag
is seen at the next turn even when every cancellation of that turn was lost.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("interlock.cancelling")

AGAIN_S = 1.0
"""Seconds to wait for a cancelled task before cancelling it again (a task's own cleanup
after its cancellation normally takes far less)."""


async def cancel_and_wait(
    *tasks: asyncio.Future[Any] | None,
    again: float = AGAIN_S,
    limit: float | None = None,
) -> set[asyncio.Future[Any]]:
    """Cancel ``tasks`` and wait until each has ended, cancelling again every ``again``
    seconds one is still running (``None`` entries are passed over).

    What a task ended with (its result, its cancellation, an error) is taken and dropped:
    a stopped task's error was logged where it happened (it is logged here at debug level).
    A cancellation of the caller is not swallowed: the tasks still running are cancelled
    once more and the caller's cancellation is raised.

    Returns the tasks still running after ``limit`` seconds (empty when no limit is given:
    it waits as long as they take).
    """
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    given = {task for task in tasks if task is not None}
    pending = {task for task in given if not task.done()}
    try:
        while pending:
            for task in pending:
                task.cancel()
            wait = again if deadline is None else min(again, deadline - loop.time())
            if wait <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=wait)
    except asyncio.CancelledError:
        for task in pending:
            task.cancel()
        raise
    for task in given - pending:
        if not task.cancelled() and task.exception() is not None:
            log.debug("a stopped task had failed", exc_info=task.exception())
    return pending
