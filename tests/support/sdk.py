"""What the worker tests share: an observer of the tasks a worker settles."""

from __future__ import annotations

import asyncio

from interlock.sdk import Outcome, WorkerObserver


class Finished(WorkerObserver):
    """Records settled tasks, so a test can await one instead of sleeping."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[tuple[str | None, Outcome, str | None]] = asyncio.Queue()

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        self.events.put_nowait((action_id, outcome, error_class))

    async def next(self, wait: float = 5.0) -> tuple[str | None, Outcome, str | None]:
        """(action id, outcome, error class) of the next task settled."""
        return await asyncio.wait_for(self.events.get(), wait)
