"""Hooks for watching a worker's tasks (metrics, tracing, tests) without touching its loop."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """How a task message was settled."""

    COMPLETED = "completed"
    """Answered ``task.completed``."""
    EMITTED = "emitted"
    """Answered with a handler-chosen type."""
    FAILED = "failed"
    """Answered ``task.failed`` (see the error class)."""
    REJECTED = "rejected"
    """Not a task request that can be answered: dead-lettered and terminated."""
    RETURNED = "returned"
    """Handed back unanswered (nak) for redelivery: worker stopping, or the result could
    not be published."""


class WorkerObserver:
    """Subclass and override; pass instances as ``Worker(observers=[...])``.

    Calls happen on the worker's event loop, so they must be quick and must not block. An
    exception raised here is logged and otherwise ignored.
    """

    def task_started(self, capability: str, action_id: str | None) -> None:
        """A task message was received (``action_id`` is None when it cannot be read)."""

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        """A task message was settled (acked, naked or terminated)."""
