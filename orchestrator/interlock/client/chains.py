"""Chains of runs continued as new, followed by the client: a run whose log ended with
``run.continued`` goes on in the run it names, so ``result`` answers for the last run of
the chain and a signal goes to its newest run."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from interlock.client.errors import no_stream_is_no_run
from interlock.core.vocabulary import RunStatus
from interlock.runtime.errors import UnknownRun
from interlock.views import RunResult
from interlock.views.build import run_result

if TYPE_CHECKING:
    from interlock.runtime.client import InterlockClient
    from interlock.runtime.snapshots import Read
    from interlock.runtime.waiting import RunWatcher

EVENT_RUN_ID = re.compile(r"r[0-9a-f]{24}")
"""The form of a run id a trigger event's run gets (``core.incoming.derive_run_id``)."""
HOPS = 100_000
"""The most runs of a chain followed (a bound: a chain is a list)."""
NEXT_START_S = 30.0
"""How long a run that continued is given for the run after it to start (the orchestrator
starts it once it has read the ``run.continued``)."""


async def newest(ops: InterlockClient, run_id: str) -> tuple[Read, list[str]]:
    """The run of ``run_id``'s chain that goes on now (as read), and the runs followed to
    it, ``run_id`` first (one run: it did not continue). A run that continued whose next
    run has not started yet is the newest."""
    read = await ops.read_state(run_id)
    followed = [run_id]
    for _ in range(HOPS):
        chain = read.state.chain
        if read.state.status != RunStatus.CONTINUED or chain is None or chain.next is None:
            break
        try:
            read = await ops.read_state(chain.next)
        except UnknownRun:
            break
        followed.append(chain.next)
    return read, followed


def with_chain(result: RunResult, followed: list[str]) -> RunResult:
    """``result`` naming the runs followed to it (none when there was one)."""
    if len(followed) < 2:
        return result
    return RunResult(
        run_id=result.run_id,
        status=result.status,
        state=result.state,
        outputs=result.outputs,
        error=result.error,
        reason=result.reason,
        finished_at=result.finished_at,
        chain=followed,
    )


async def result(
    ops: InterlockClient,
    watcher: RunWatcher,
    run_id: str,
    wait: bool,
    timeout: float | None,  # noqa: ASYNC109
) -> RunResult:
    """``Client.result``: now, or (``wait``) once the chain's last run has ended, a run
    not found that an event may start (:func:`may_start_later`) waited for first (up to
    ``timeout``, or ``NEXT_START_S`` without one). Raises RunNotStarted for a run an emit
    of this client said it starts and that has not started (yet), UnknownRun for another
    run found nowhere."""
    if not wait:
        try:
            async with no_stream_is_no_run(run_id):
                read, followed = await newest(ops, run_id)
        except UnknownRun:
            raise watcher.told.unknown(run_id) from None
        return with_chain(run_result(read.records, read.state), followed)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        return await result_at_end(watcher, run_id, timeout, ops.read_state)
    except UnknownRun:
        if not may_start_later(watcher, run_id):
            raise watcher.told.unknown(run_id) from None
    # A run an event starts exists once the orchestrator has taken the event (and copied
    # its data kept by reference): waited for, within the wait's own bound.
    left = NEXT_START_S if timeout is None else max(timeout - (loop.time() - started), 0.0)
    if not await watcher.exists(run_id, left):
        raise watcher.told.unknown(run_id)
    if timeout is not None:
        timeout = max(timeout - (loop.time() - started), 0.0)
    return await result_at_end(watcher, run_id, timeout, ops.read_state)


def may_start_later(watcher: RunWatcher, run_id: str) -> bool:
    """Whether a run found nowhere may still be started by an event already taken: one an
    emit of this client said it starts, or any id of the form a trigger event's run gets
    (``r`` and 24 hex digits, ``core.incoming.derive_run_id``), as another process's emit
    may have named it. Another id (a typo, a name no event gives) is unknown at once."""
    return run_id in watcher.told or EVENT_RUN_ID.fullmatch(run_id) is not None


async def result_at_end(
    watcher: RunWatcher,
    run_id: str,
    timeout: float | None,  # noqa: ASYNC109
    read: Callable[[str], Awaitable[Read]],
) -> RunResult:
    """The end of ``run_id``'s chain: each run waited for in turn (``read``: its state once
    it has finished) until one ends otherwise than by continuing. Raises UnknownRun (no
    such run), TimeoutError."""
    loop = asyncio.get_running_loop()
    deadline = math.inf if timeout is None else loop.time() + timeout
    followed = [run_id]
    found = await watcher.finished_read(run_id, timeout, read)
    for _ in range(HOPS):
        chain = found.state.chain
        if found.state.status != RunStatus.CONTINUED or chain is None or chain.next is None:
            break
        nxt = chain.next
        followed.append(nxt)
        left = deadline - loop.time()
        if left <= 0:
            raise TimeoutError(f"run {nxt} (continuing {run_id}) has not finished")
        if not await watcher.exists(nxt, min(left, NEXT_START_S)):
            raise TimeoutError(f"run {nxt}, which continues {followed[-2]}, has not started")
        left = deadline - loop.time()
        found = await watcher.finished_read(nxt, None if math.isinf(left) else max(left, 0.0), read)
    return with_chain(run_result(found.records, found.state), followed)
