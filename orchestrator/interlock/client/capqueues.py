"""Capabilities' lines as the orchestrator keeps them: each limit and key of a capability
(slots, tokens), what a paused capability holds, and pausing and resuming one."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import msgspec

from interlock.client.errors import UnknownAgent
from interlock.core.limitdef import CAPABILITY_LIMIT, capacity_names
from interlock.core.names import CAPABILITY_NAME
from interlock.core.pauses import PAUSED, check_reason
from interlock.runtime.client import InterlockClient
from interlock.runtime.pausing import CAPABILITY, Pauses
from interlock.runtime.slotlines import SlotEntry
from interlock.transport.clock import utc_now
from interlock.views.queueshape import QueueView


def capability_of(limit: str) -> str | None:
    """The capability a line's limit belongs to (None: a workflow's or a trigger's)."""
    if not limit.startswith(CAPABILITY_LIMIT):
        return None
    name = limit.removeprefix(CAPABILITY_LIMIT).removesuffix(PAUSED)
    return name.removesuffix(":rate")


def kind_of(limit: str) -> str:
    if limit.endswith(PAUSED):
        return "paused"
    if limit.startswith(CAPABILITY_LIMIT) and limit.endswith(":rate"):
        return "rate"
    for kind in ("debounce", "batch", "rate"):
        if limit.endswith(f"@{kind}"):
            return kind
    return "concurrency"


def rate_view(view: QueueView, entry: SlotEntry, now: datetime) -> QueueView:
    """A capability's rate line: the tokens not yet back of its burst, and when the next
    one is there."""
    interval = entry.per_s / max(entry.size, 1)
    burst = max(entry.burst, 1)
    behind = entry.tat - now.timestamp()
    used = min(burst, max(0, math.ceil(behind / interval - 1e-9))) if interval else 0
    next_at = entry.tat - (burst - 1) * interval
    due = None
    if next_at > now.timestamp():
        due = datetime.fromtimestamp(next_at, UTC).isoformat(timespec="milliseconds")
        due = due.replace("+00:00", "Z")
    return msgspec.structs.replace(
        view,
        running=used,
        size=burst,
        rate_limit=entry.size,
        per_s=entry.per_s,
        next_token_at=due,
    )


Paused = tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]
"""The capabilities and the workflows (``namespace/name``) paused now, each with its pause
(``at``: since when, ``reason``)."""


async def paused_now(ops: InterlockClient) -> Paused:
    """The capabilities and the workflows (``namespace/name``) paused now, with their
    pauses."""
    found = await Pauses(ops.nc, ops.subjects).all_paused()
    capabilities = {
        k.removeprefix(CAPABILITY): v for k, v in found.items() if k.startswith(CAPABILITY)
    }
    workflows = {
        k.removeprefix("wf.").replace(".", "/", 1): v
        for k, v in found.items()
        if k.startswith("wf.")
    }
    return capabilities, workflows


def _why(pause: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """A pause's since-when and reason (``paused_since``, ``paused_reason``)."""
    if pause is None:
        return None, None
    at, reason = pause.get("at"), pause.get("reason")
    return (at if isinstance(at, str) else None), (reason if isinstance(reason, str) else None)


def annotated(view: QueueView, entry: SlotEntry | None, now: datetime, paused: Paused) -> QueueView:
    """A line with what it is, whose it is and whether that is paused (since when, why)."""
    capability = capability_of(view.limit)
    kind = kind_of(view.limit)
    if capability is not None:
        pause = paused[0].get(capability)
    else:
        pause = paused[1].get(view.limit.removesuffix(PAUSED)) if kind == "paused" else None
    since, reason = _why(pause)
    view = msgspec.structs.replace(
        view,
        kind=kind,
        capability=capability,
        paused=pause is not None,
        paused_since=since,
        paused_reason=reason,
    )
    if kind == "rate" and capability is not None and entry is not None:
        view = rate_view(view, entry, now)
    return view


def pause_lines(views: list[QueueView], paused: Paused) -> list[QueueView]:
    """A line for each paused capability and workflow that holds nothing yet (a paused
    thing says so wherever queues are shown)."""
    shown = {v.limit for v in views}
    wanted: list[tuple[str, str | None, dict[str, Any]]] = [
        (f"{CAPABILITY_LIMIT}{c}{PAUSED}", c, p) for c, p in sorted(paused[0].items())
    ]
    wanted += [(f"{w}{PAUSED}", None, p) for w, p in sorted(paused[1].items())]
    return [
        QueueView(
            limit=limit,
            key="paused",
            running=0,
            size=0,
            queued=0,
            kind="paused",
            capability=capability,
            paused=True,
            paused_since=_why(pause)[0],
            paused_reason=_why(pause)[1],
        )
        for limit, capability, pause in wanted
        if limit not in shown
    ]


async def declared(ops: InterlockClient, capability: str) -> dict[str, Any]:
    """The capability as its AgentDef declares it; raises UnknownAgent."""
    if not CAPABILITY_NAME.match(capability):
        raise UnknownAgent(f"no capability {capability!r}: not dot-separated words")
    for spec in (await ops.registry.agent_specs()).values():
        for cap in spec.get("capabilities", []):
            if isinstance(cap, dict) and cap.get("name") == capability:
                return cap
    raise UnknownAgent(f"no AgentDef declares capability {capability!r}")


async def capability_lines(
    ops: InterlockClient, capability: str, views: list[QueueView]
) -> list[QueueView]:
    """``--capability NAME``: its lines, and a line of no key for each limit it declares
    with nobody at work or waiting."""
    cap = await declared(ops, capability)
    concurrency, rate = capacity_names(capability)
    names = {concurrency, rate, f"{concurrency}{PAUSED}"}
    mine = [v for v in views if v.limit in names]
    shown = {v.limit for v in mine}
    paused = any(v.paused for v in mine)
    since, reason = next(((v.paused_since, v.paused_reason) for v in mine if v.paused), _why(None))
    limit = cap.get("concurrency")
    if isinstance(limit, dict) and concurrency not in shown:
        mine.append(
            QueueView(
                limit=concurrency,
                key="",
                running=0,
                size=int(limit.get("limit", 0)),
                queued=0,
                capability=capability,
                paused=paused,
                paused_since=since,
                paused_reason=reason,
            )
        )
    limit = cap.get("rate")
    if isinstance(limit, dict) and rate not in shown:
        from interlock.core.lowering_scope import parse_duration

        mine.append(
            QueueView(
                limit=rate,
                key="",
                running=0,
                size=int(limit.get("burst", 1)),
                queued=0,
                kind="rate",
                capability=capability,
                paused=paused,
                paused_since=since,
                paused_reason=reason,
                rate_limit=int(limit.get("limit", 0)),
                per_s=parse_duration(str(limit.get("per", ""))),
            )
        )
    return mine


async def pause_capability(
    ops: InterlockClient, capability: str, reason: str
) -> dict[str, Any] | None:
    """Pause a capability (nothing more of it is dispatched until it is resumed): the
    pause already in force (``at``, ``reason``; left as it is), or None when this call
    paused it. Raises UnknownAgent when no AgentDef declares it; ValueError for a reason
    over 1,024 characters (nothing is sent)."""
    check_reason(reason)
    await declared(ops, capability)
    return await Pauses(ops.nc, ops.subjects).pause_capability(capability, utc_now(), reason)


async def resume_capability(ops: InterlockClient, capability: str) -> bool:
    """Resume a capability: whether it was paused."""
    if not CAPABILITY_NAME.match(capability):
        raise UnknownAgent(f"no capability {capability!r}: not dot-separated words")
    return await Pauses(ops.nc, ops.subjects).resume_capability(capability)
