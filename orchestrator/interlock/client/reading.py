"""Reading runs and dead letters for :class:`~interlock.client.Client`: the run index, a
run's log (and following it on the client's one subscription), whether an orchestrator
reads the run logs, and the dead letters kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from interlock.client.errors import UnknownRun, UnknownWorkflow, no_stream_is_no_run
from interlock.core import events as ev
from interlock.core.state import fold
from interlock.core.vocabulary import RunStatus
from interlock.transport.refusals import refusable
from interlock.views import DeadLetterView, RunDescription, RunResult, RunSummary
from interlock.views.build import dead_letter_view, waiting_of
from interlock.views.listing import held_by_pause, past_pauses, summary_from_index

if TYPE_CHECKING:
    from interlock.core.state import RunState
    from interlock.runtime.client import DeadLetter, InterlockClient
    from interlock.transport.subjects import Subjects
    from interlock.views.outline import WorkflowOutline


async def runs(
    ops: InterlockClient,
    workflow: str | None,
    status: str | None,
    limit: int | None,
    waiting: str | None = None,
) -> list[RunSummary]:
    """Runs from the run index, newest first (none when there is no index yet), with
    what each running one waits for; ``waiting``: only those waiting for that. Read a
    page at a time from the server (:class:`~interlock.runtime.runlisting.RunPages`):
    ``limit`` runs cost a page's reads, whatever the index holds."""
    if limit is not None and limit <= 0:
        return []
    # Imported here: a read command loads what it uses only.
    from interlock.runtime.runlisting import RunPages

    async def keep(items: list[dict[str, Any]]) -> list[Any]:
        found = [summary_from_index(i) for i in items]
        return waiting_for(await with_waiting(ops, found), waiting) if waiting else found

    try:
        found, _ = await RunPages(ops.nc, ops.subjects).page(
            workflow=workflow,
            status=RunStatus.RUNNING if waiting and not status else status,
            limit=limit if limit is not None else 1 << 31,
            keep=keep,
        )
    except (BucketNotFoundError, NotFoundError):
        return []
    return found if waiting else await with_waiting(ops, found)


def waiting_for(found: list[RunSummary], wanted: str) -> list[RunSummary]:
    """The runs waiting for ``wanted`` (a kind, ``approval``, or a kind and a name,
    ``agent:review``)."""
    return [r for r in found if any(w.matches(wanted) for w in r.waiting)]


async def with_waiting(
    ops: InterlockClient, found: list[RunSummary], *, complete: bool = False
) -> list[RunSummary]:
    """The running runs of ``found`` with what their state waits for, read from their
    workflow version's outline (each version read once; a version no longer stored
    leaves it empty). A version stored by an older release has no record of what its
    states ask for: it lists no agents, unless ``complete`` (it is compiled once, which a
    long-lived reader such as the gateway can afford and a CLI command should not)."""
    outlines: dict[tuple[str, str, int], WorkflowOutline | None] = {}
    out = []
    paused: set[str] | None = None
    for run in found:
        if run.status == str(RunStatus.RUNNING) and held_by_pause(run):
            if paused is None:  # read once, and only for a list with such a run
                paused = await paused_workflows(ops)
            run = past_pauses(run, paused)
        # Queued (before its first state, or in it, migrated onto a limited version): it
        # waits for its slots, not for what its state waits for.
        queued = any(w.kind == "slot" for w in run.waiting)
        if run.status != str(RunStatus.RUNNING) or not run.state or queued:
            out.append(run)
            continue
        key = (run.namespace, run.workflow, run.version)
        if key not in outlines:
            try:
                outlines[key] = (await ops.registry.stored(*key, complete=complete)).outline
            except (UnknownWorkflow, KeyNotFoundError, BucketNotFoundError, NotFoundError):
                outlines[key] = None
        outline = outlines[key]
        out.append(run if outline is None else replace(run, waiting=waiting_of(outline, run.state)))
    return out


async def paused_workflows(ops: InterlockClient) -> set[str]:
    """The workflows (``namespace/name``) paused now."""
    from interlock.client.capqueues import paused_now  # loaded by the lists that need it

    return set((await paused_now(ops))[1])


async def logs(
    ops: InterlockClient,
    run_id: str,
    *,
    follow: bool,
    tail: int | None,
    since: str | None,
) -> AsyncIterator[ev.AnyRecord]:
    """The records of ``run_id`` chosen by ``tail`` or ``since``; with ``follow``, then
    each new one until the run ends."""
    # Through the watcher, whose follows it may join: any number of logs followed at once
    # make at most its READERS reads at a time, the first ones too.
    async with no_stream_is_no_run(run_id):
        raw = await ops.watcher.read_raw(run_id)
    if not raw:
        raise UnknownRun(run_id)
    records = [r for _, payload in raw for r in ev.decode_batch(payload)]
    shown = [r for r in records if since is None or r.time >= since]
    if tail is not None:
        shown = shown[-tail:] if tail > 0 else []
    for record in shown:
        yield record
    if not follow or fold(records).finished:
        return
    # Following shares the client's one subscription on the run logs with every wait
    # and every other follow: N runs followed cost the server no consumer at all.
    async for _, payload in ops.watcher.follow(run_id, after=raw[-1][0]):
        for record in ev.decode_batch(payload):
            yield record


async def orchestrator_seen(ops: InterlockClient) -> bool | None:
    """Whether an orchestrator reads the run logs (see ``Client.orchestrator_seen``)."""
    # The partition new runs go to now (a relay reads every partition).
    try:
        found = await ops.log.placement.current()
        stream = ops.subjects.runs_stream_of(found.current.count - 1)
        info = await ops.js.consumer_info(stream, "relay")
    except NotFoundError:
        return False
    # A probe: any failure means 'unknown'.
    except Exception:  # noqa: BLE001
        return None
    if info.num_waiting:
        return True
    last = info.delivered.last_active if info.delivered is not None else None
    if last is not None and (datetime.now(UTC) - last).total_seconds() < 10:
        return True
    return not (info.num_pending or info.num_ack_pending)


_LOOK_S = 1.0
"""How long the run list waits to learn how far behind the run index is."""


async def index_behind(ops: InterlockClient) -> int | None:
    """How many run-log appends (messages, each a batch of a run's records) the run index
    has not taken in yet: those the relays have not acknowledged, which they do once each
    run's index entry is written (None: cannot tell, e.g. not allowed to look)."""
    try:
        found = await ops.log.placement.current()
        streams = (ops.subjects.runs_stream_of(p) for p in range(found.current.count))

        async def look() -> list[Any]:
            # Awaited inside: a look ended early leaves no gathered error unread.
            return await asyncio.gather(*(ops.js.consumer_info(s, "relay") for s in streams))

        # Bounded: a credential not allowed to look is not answered at all, and the
        # server's refusal ends this look (not the command around it: refusable).
        infos = await refusable(ops.nc, asyncio.wait_for(look(), _LOOK_S))
    # A probe: any failure means 'unknown'.
    except Exception:  # noqa: BLE001
        return None
    return sum(int(i.num_pending or 0) + int(i.num_ack_pending or 0) for i in infos)


async def dead_letters(ops: InterlockClient, reason: str | None) -> list[DeadLetterView]:
    """The dead letters kept, oldest first (none when there is no dead-letter stream)."""
    try:
        letters = await ops.dead_letters(reason)
    except NotFoundError:
        return []
    return [letter_view(d, ops.subjects) for d in letters]


def letter_view(d: DeadLetter, subjects: Subjects) -> DeadLetterView:
    """A dead letter as the client shows it, with why a redrive would refuse it."""
    return dead_letter_view(
        d.seq,
        d.time,
        d.reason,
        d.detail,
        d.subject,
        d.original_headers,
        d.data,
        d.redrive_refusal(subjects),
    )


async def loaded_result(ops: InterlockClient, found: RunResult) -> RunResult:
    """``found`` with the outputs kept by reference loaded."""
    if not found.outputs:
        return found
    outputs = await ops.payloads.loaded_values(found.outputs, "outputs")
    return replace(found, outputs=outputs)


async def loaded_description(ops: InterlockClient, described: RunDescription) -> RunDescription:
    """The description with the payloads kept by reference in it loaded (the inputs, the
    context values, the outputs)."""
    load = ops.payloads.loaded_values
    return replace(
        described,
        inputs=await load(described.inputs, "inputs"),
        context=await load(described.context, "context"),
        outputs=await load(described.outputs, "outputs"),
    )


async def described(
    ops: InterlockClient, described: RunDescription, state: RunState
) -> RunDescription:
    """``Client.describe``'s answer: payloads loaded, and a queued run's place in line."""
    from interlock.client.queues import with_places

    return await with_places(ops, await loaded_description(ops, described), state)
