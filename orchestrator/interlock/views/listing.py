"""A run of the run list as the run index's entry has it (the orchestrator writes the
index behind the runs; the gateway and the client page it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from interlock.core.vocabulary import RunStatus
from interlock.views.pauses import PauseView
from interlock.views.shapes import ErrorView, RunOrigin, RunSummary, WaitingOn


def summary_from_index(item: Mapping[str, Any]) -> RunSummary:
    """A run-index entry (the runs bucket the orchestrator keeps) as a summary."""
    error = item.get("error")
    status = str(item.get("status", RunStatus.RUNNING))
    return RunSummary(
        run_id=str(item.get("run_id", "")),
        workflow=str(item.get("workflow", "")),
        namespace=str(item.get("namespace", "default")),
        version=int(item.get("version", 0) or 0),
        status=status,
        state=str(item.get("state", "")),
        started_at=str(item.get("started_at", "")),
        updated_at=str(item.get("updated_at", "")),
        error=(
            ErrorView(error_class=str(error.get("class", "")), message=str(error.get("message")))
            if isinstance(error, Mapping)
            else None
        ),
        forked_from=(
            RunOrigin(
                run_id=str(forked.get("run_id", "")),
                seq=int(forked.get("seq", 0) or 0),
                started_at=_text(forked.get("started_at")),
            )
            if isinstance(forked := item.get("forked_from"), Mapping)
            else None
        ),
        migrated_from=(
            migrated if isinstance(migrated := item.get("migrated_from"), int) else None
        ),
        continued_from=_text(item.get("continued_from")),
        continued_to=_text(item.get("continued_to")),
        # A run that ended while queued (skipped, cancelled, out of time) waits no more.
        waiting=(
            _queued(item.get("queued"), item.get("queued_keys"))
            if status == RunStatus.RUNNING
            else []
        ),
        paused=PauseView.of(item.get("paused")),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _queued(limits: Any, keys: Any) -> list[WaitingOn]:
    """What a run queued for slots of concurrency limits waits for (before its first
    state, or in it once migrated onto a limited version): each limit's slot, and key."""
    if not isinstance(limits, list):
        return []
    keys = keys if isinstance(keys, Mapping) else {}
    return [WaitingOn(kind="slot", name=str(n), key=str(keys.get(n, ""))) for n in limits]


PAUSED = "@paused"
"""A workflow's pause line (interlock.core.pauses.PAUSED, not imported: views stay light)."""
RESUMED = "@resumed"
"""What a queued run shows for its workflow's pause line once the workflow is resumed."""


def held_by_pause(run: RunSummary) -> bool:
    """Whether the run is listed as waiting in a workflow's pause line."""
    return any(_pause_line(w) is not None for w in run.waiting)


def past_pauses(run: RunSummary, paused: set[str]) -> RunSummary:
    """The run with the pause line of its workflow (``<namespace>/<name>@paused``) shown
    as ``<namespace>/<name>@resumed`` when the workflow is not in ``paused`` (the
    workflows paused now, ``namespace/name``): the index keeps the limits of the run's
    ``run.queued`` until it is admitted, and no record says that the workflow was
    resumed meanwhile."""
    waiting = [
        WaitingOn(kind=w.kind, name=f"{line}{RESUMED}", key=w.key)
        if (line := _pause_line(w)) is not None and line not in paused
        else w
        for w in run.waiting
    ]
    return run if waiting == run.waiting else msgspec.structs.replace(run, waiting=waiting)


def _pause_line(w: WaitingOn) -> str | None:
    """The workflow (``namespace/name``) whose pause line ``w`` is, if it is one."""
    if w.kind != "slot" or not w.name.endswith(PAUSED) or w.name.startswith("cap:"):
        return None
    return w.name.removesuffix(PAUSED)
