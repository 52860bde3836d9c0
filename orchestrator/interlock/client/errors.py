"""What the client raises: each derives from :class:`interlock.core.vocabulary.InterlockError`.

Those the runtime raises are the runtime's own classes (``except UnknownRun`` catches the
same error whether the client or the orchestrator's code raised it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from interlock.core.ids import InvalidRunId
from interlock.core.vocabulary import InterlockError
from interlock.runtime.errors import (
    EventTooLarge,
    InvalidInputs,
    NotRedrivable,
    RunExists,
    RunNotEnded,
    UnknownDeadLetter,
    UnknownRun,
    UnknownWorkflow,
)
from interlock.transport.directget import LogReadError
from interlock.transport.errors import ConnectionFailed

if TYPE_CHECKING:
    from interlock.core.compiler import Compiled

__all__ = [
    "ConnectionFailed",
    "EventTooLarge",
    "InterlockError",
    "InvalidInputs",
    "InvalidManifest",
    "InvalidRunId",
    "NotRedrivable",
    "RunExists",
    "RunNotEnded",
    "UnknownAgent",
    "UnknownDeadLetter",
    "UnknownRun",
    "UnknownWorkflow",
]


class InvalidManifest(ValueError, InterlockError):
    """A manifest did not validate; nothing was applied. ``diagnostics`` says where and why."""

    def __init__(self, compiled: Compiled) -> None:
        self.diagnostics = list(compiled.diagnostics)
        n = len(self.diagnostics)
        lines = "\n".join(str(d) for d in self.diagnostics)
        super().__init__(f"{n} error{'s' if n != 1 else ''}; nothing was applied\n{lines}")


class UnknownAgent(LookupError, InterlockError):
    """No AgentDef by that name."""


@contextlib.asynccontextmanager
async def no_stream_is_no_run(run_id: str) -> AsyncIterator[None]:
    """Where nothing was ever applied there is no runs stream (no JetStream responder
    answers a direct get on it): that run does not exist."""
    try:
        yield
    except LogReadError as exc:
        if "503" in str(exc) or "stream not found" in str(exc):
            raise UnknownRun(run_id) from None
        raise
