"""Prometheus metrics for agent workers, as a :class:`WorkerObserver`."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping
from datetime import UTC
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from interlock.core.rfc3339 import parse_time

from .observe import Outcome, WorkerObserver

if TYPE_CHECKING:
    from interlock.transport.cloudevents import CloudEvent

_TASKS = Counter(
    "interlock_agent_tasks",
    "Task messages settled by agent workers",
    ["worker", "capability", "outcome", "error_class"],
)
_DURATION = Histogram(
    "interlock_agent_task_duration_seconds",
    "Time from receiving a task message to settling it",
    ["worker", "capability"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
_QUEUE_WAIT = Histogram(
    "interlock_agent_queue_wait_seconds",
    "Time from the orchestrator requesting a task (its CloudEvent time) to a worker taking it",
    ["worker", "capability"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
_CHILDREN = 1024
"""Outcome and error-class children kept at hand (error classes may be the handler's own)."""

_received: contextvars.ContextVar[tuple[str, float] | None] = contextvars.ContextVar(
    "interlock_task_received", default=None
)
"""A task's request time and when it was received: noted in ``task_received``, observed
in ``task_finished`` (the worker calls both in the context it makes for each task
message), so that the histogram's work comes after the answer, not before the handler."""

_IN_FLIGHT = Gauge(
    "interlock_agent_tasks_in_flight",
    "Task messages received and not yet settled",
    ["worker"],
)


class PrometheusObserver(WorkerObserver):
    """Counts, times and gauges one worker's tasks in the default Prometheus registry."""

    def __init__(self, worker: str) -> None:
        self._worker = worker
        self._in_flight = _IN_FLIGHT.labels(worker=worker)
        # Labelled children, looked up once: ``labels()`` sorts and locks on every call.
        self._waits: dict[str, Any] = {}
        self._durations: dict[str, Any] = {}
        self._settled: dict[tuple[str, str, str], Any] = {}

    def task_started(self, capability: str, action_id: str | None) -> None:
        self._in_flight.inc()

    def task_received(
        self, capability: str, event: CloudEvent, headers: Mapping[str, str] | None
    ) -> None:
        """A task request was decoded: when, noted for :meth:`task_finished` (which
        observes how long it waited since it was requested, once the task is answered)."""
        if event.time:
            _received.set((event.time, time.time()))

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        self._in_flight.dec()
        received = _received.get()
        if received is not None:
            self._queue_wait(capability, *received)
        key = (capability, str(outcome), error_class or "")
        settled = self._settled.get(key)
        if settled is None:
            settled = _TASKS.labels(
                worker=self._worker, capability=key[0], outcome=key[1], error_class=key[2]
            )
            if len(self._settled) < _CHILDREN:
                self._settled[key] = settled
        settled.inc()
        duration = self._durations.get(capability)
        if duration is None:
            duration = self._durations[capability] = _DURATION.labels(
                worker=self._worker, capability=capability
            )
        duration.observe(seconds)

    def _queue_wait(self, capability: str, requested_at: str, received_at: float) -> None:
        """How long a task waited between its request (its CloudEvent time) and a worker
        taking it (``received_at``, seconds since the epoch)."""
        try:
            requested = parse_time(requested_at)
        except ValueError:
            return
        if requested.tzinfo is None:
            requested = requested.replace(tzinfo=UTC)
        wait = received_at - requested.timestamp()
        child = self._waits.get(capability)
        if child is None:
            child = self._waits[capability] = _QUEUE_WAIT.labels(
                worker=self._worker, capability=capability
            )
        child.observe(max(wait, 0.0))
