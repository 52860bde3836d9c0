"""The concurrency limits as the orchestrator keeps them (the slots bucket): where a queued
run stands, and every limit and key's runs holding and waiting."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from interlock.core.names import WORKFLOW_REF
from interlock.core.pauses import PAUSED
from interlock.core.state import RunState
from interlock.runtime.client import InterlockClient
from interlock.runtime.concurrency import SlotEntry, Slots
from interlock.runtime.errors import UnknownWorkflow
from interlock.runtime.pausing import Pauses
from interlock.runtime.versions import StoredWorkflow
from interlock.transport.clock import utc_now
from interlock.views.shapes import QueueView, RunDescription, SlotView


async def with_places(
    ops: InterlockClient, described: RunDescription, state: RunState
) -> RunDescription:
    """``described`` with each slot of a queued run saying whether the run holds it, or
    its place in line, and how many runs hold one (as the orchestrator keeps them)."""
    if not state.queued or not described.slots:
        return described
    slots = Slots(ops.nc, ops.subjects)
    fair = {(c.limit, c.key): c.fair for c in state.slots or []}
    seen: list[SlotView] = []
    for view in described.slots:
        lines = await slots.lines(view.limit, view.key)
        if lines is None:
            seen.append(msgspec.structs.replace(view, running=0))
            continue
        holding = lines.entry.holds(state.run_id)
        place = (
            None
            if holding
            else await lines.place(state.run_id, fair.get((view.limit, view.key), ""))
        )
        seen.append(
            msgspec.structs.replace(
                view, holding=holding, place=place, running=len(lines.entry.holders)
            )
        )
    return msgspec.structs.replace(described, slots=seen)


async def list_queues(ops: InterlockClient, workflow: str | None = None) -> list[QueueView]:
    """Every concurrency limit and key with a run holding or waiting, sorted by limit then
    key; with ``workflow`` (``name`` or ``namespace/name``), the limits it declares."""
    entries = await Slots(ops.nc, ops.subjects).entries()
    if workflow is not None:
        names = await limit_names(ops, workflow)
        entries = [e for e in entries if e.limit in names]
    now = datetime.now(UTC)
    return sorted((queue_view(e, now) for e in entries), key=lambda q: (q.limit, q.key))


def queue_view(entry: SlotEntry, now: datetime) -> QueueView:
    first = entry.oldest
    waited = None
    if first is not None:
        waited = max((now - datetime.fromisoformat(first)).total_seconds(), 0.0)
    return QueueView(
        limit=entry.limit,
        key=entry.key,
        running=len(entry.holders),
        size=entry.size,
        queued=entry.queued,
        oldest_queued_at=first,
        oldest_wait_s=None if waited is None else round(waited, 3),
    )


async def limit_names(ops: InterlockClient, workflow: str) -> set[str]:
    """The names of the limits the latest version of ``workflow`` declares (read from its
    stored manifest: nothing is compiled). Raises UnknownWorkflow."""
    stored = await _stored(ops, workflow)
    spec = stored.manifest.get("spec") or {}
    out = {f"{stored.namespace}/{stored.name}{PAUSED}"}
    for i, limit in enumerate(spec.get("concurrency") or []):
        scope = limit.get("scope") if isinstance(limit, dict) else None
        out.add(f"{stored.namespace}/{scope or f'{stored.name}#{i + 1}'}")
    return out


async def pause_workflow(ops: InterlockClient, workflow: str, reason: str) -> str:
    """Pause a workflow (its new runs wait until it is resumed); its ``namespace/name``.
    Raises UnknownWorkflow."""
    stored = await _stored(ops, workflow)
    pauses = Pauses(ops.nc, ops.subjects)
    await pauses.pause(stored.namespace, stored.name, utc_now(), reason)
    return f"{stored.namespace}/{stored.name}"


async def resume_workflow(ops: InterlockClient, workflow: str) -> tuple[str, bool]:
    """Resume a workflow: its ``namespace/name``, and whether it was paused."""
    stored = await _stored(ops, workflow)
    done = await Pauses(ops.nc, ops.subjects).resume(stored.namespace, stored.name)
    return f"{stored.namespace}/{stored.name}", done


async def _stored(ops: InterlockClient, workflow: str) -> StoredWorkflow:
    if not WORKFLOW_REF.match(workflow):
        raise UnknownWorkflow(f"no workflow {workflow!r}: not NAME or NAMESPACE/NAME")
    return await ops.registry.stored_latest(workflow)
