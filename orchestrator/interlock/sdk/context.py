"""What a handler sees besides its input (``TaskContext``) and what it may return (``Emit``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from interlock.core.vocabulary import TASK_COMPLETED, TASK_FAILED
from interlock.transport.cloudevents import CloudEvent

__all__ = ["TASK_COMPLETED", "TASK_FAILED", "Emit", "TaskContext"]


_RESERVED_PREFIX = "io.interlock."


@dataclass(frozen=True, slots=True)
class Emit:
    """Return this from a handler to answer with a CloudEvent type of its choosing.

    ``Emit("review.approved", {"score": 9})`` sends a result of type ``review.approved``
    instead of ``task.completed``; workflows route on it like on any other event. The data
    is checked against the capability's output schema, as a plain return value would be.
    """

    type: str
    data: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type.strip():
            raise ValueError("Emit needs a non-empty CloudEvent type")
        if self.type == TASK_FAILED:
            raise ValueError(
                f"Emit({TASK_FAILED!r}) is not allowed: raise AgentError or RetryableError"
            )
        if self.type.startswith(_RESERVED_PREFIX):
            raise ValueError(
                f"Emit type {self.type!r} is reserved: {_RESERVED_PREFIX}* types belong to "
                "the orchestrator"
            )


class TaskContext:
    """One task being handled: where it comes from, how long it may take, and a way to
    tell JetStream it is still being worked on."""

    __slots__ = (
        "_progress",
        "action_id",
        "attempt",
        "capability",
        "deadline",
        "delivery",
        "event",
        "logger",
        "run_id",
        "traceparent",
        "worker",
    )

    def __init__(
        self,
        *,
        event: CloudEvent,
        run_id: str,
        action_id: str,
        attempt: int,
        capability: str,
        deadline: datetime | None,
        worker: str,
        delivery: int,
        progress: Callable[[], Awaitable[None]],
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.event = event
        """The task request CloudEvent as received."""
        self.run_id = run_id
        self.action_id = action_id
        self.attempt = attempt
        """The orchestrator's attempt number for this action (1-based)."""
        self.capability = capability
        self.deadline = deadline
        """When the orchestrator stops waiting (UTC); the handler is cancelled then."""
        self.traceparent = event.extensions.get("traceparent")
        self.worker = worker
        self.delivery = delivery
        """How many times JetStream delivered this request (> 1 after a worker crash)."""
        self.logger = logger
        self._progress = progress

    async def in_progress(self) -> None:
        """Extend the JetStream ack deadline now (the worker also does it periodically)."""
        await self._progress()

    def remaining(self) -> float | None:
        """Seconds left until the deadline (may be negative), or None without a deadline."""
        if self.deadline is None:
            return None
        return (self.deadline - datetime.now(UTC)).total_seconds()

    def __repr__(self) -> str:
        return (
            f"TaskContext(run_id={self.run_id!r}, action_id={self.action_id!r}, "
            f"attempt={self.attempt}, capability={self.capability!r})"
        )
