"""Hooks for watching a worker's tasks (metrics, tracing, tests) without touching its loop."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING

from interlock.transport.observing import Fanout

if TYPE_CHECKING:
    from interlock.transport.cloudevents import CloudEvent

log = logging.getLogger("interlock.sdk")

_HOOKS = ("task_received", "task_started", "task_finished")


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
    exception raised here is logged and otherwise ignored. All calls for one task happen in
    that task's own context, before the handler starts and after it ended: a context
    variable set in ``task_received`` (a tracing span, say) is seen by the handler.
    """

    def task_received(
        self, capability: str, event: CloudEvent, headers: Mapping[str, str] | None
    ) -> None:
        """A task message was decoded as a CloudEvent (it may still be refused)."""

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


class WorkerObservers(WorkerObserver):
    """Fans each call out to a worker's observers, isolating their failures
    (:class:`~interlock.transport.observing.Fanout`): a hook an observer leaves as
    :class:`WorkerObserver`'s is not called at all."""

    def __init__(self, observers: Iterable[WorkerObserver] = ()) -> None:
        self._fan = Fanout(WorkerObserver, _HOOKS, log, observers)

    def add(self, observer: WorkerObserver) -> None:
        self._fan.add(observer)

    def task_received(
        self, capability: str, event: CloudEvent, headers: Mapping[str, str] | None
    ) -> None:
        self._fan.call("task_received", capability, event, headers)

    def task_started(self, capability: str, action_id: str | None) -> None:
        self._fan.call("task_started", capability, action_id)

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        self._fan.call("task_finished", capability, action_id, outcome, error_class, seconds)
