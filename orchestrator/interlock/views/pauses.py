"""What is paused, as reads show it: a run's pause, a workflow's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from interlock.core import events as ev


class PauseView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A paused run's pause: since when, why, whether with its workflow
    (``pause workflow --runs``), and how many events it holds for when it is resumed."""

    at: str
    reason: str = ""
    workflow: bool = False
    held: int = 0

    @classmethod
    def of(cls, pause: ev.RunPause | Mapping[str, Any] | None) -> PauseView | None:
        """A run state's pause, or a run-index entry's (None: not paused)."""
        if isinstance(pause, ev.RunPause):
            return cls(
                at=pause.at, reason=pause.reason, workflow=pause.workflow, held=len(pause.held)
            )
        if not isinstance(pause, Mapping):
            return None
        return cls(
            at=str(pause.get("at", "")),
            reason=str(pause.get("reason", "")),
            workflow=bool(pause.get("workflow", False)),
        )


class WorkflowPause(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A paused workflow's pause: since when, why, and whether its runs in flight were
    paused with it (``pause workflow --runs``)."""

    at: str = ""
    reason: str = ""
    runs: bool = False
    damaged: bool = False
    """Its stored value does not decode: held as a pause (with no since-when) until
    resumed, and reported where it is read."""

    @classmethod
    def of(cls, pause: Mapping[str, Any] | None) -> WorkflowPause | None:
        """The pause as the pauses bucket keeps it (None: not paused)."""
        if pause is None:
            return None
        return cls(
            at=str(pause.get("at", "")),
            reason=str(pause.get("reason", "")),
            runs=bool(pause.get("runs", False)),
            damaged=pause.get("damaged") is True,
        )
