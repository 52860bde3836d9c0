"""Prometheus metrics for agent workers, as a :class:`WorkerObserver`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from .observe import Outcome, WorkerObserver

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

    def task_started(self, capability: str, action_id: str | None) -> None:
        self._in_flight.inc()

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        self._in_flight.dec()
        _TASKS.labels(
            worker=self._worker,
            capability=capability,
            outcome=str(outcome),
            error_class=error_class or "",
        ).inc()
        _DURATION.labels(worker=self._worker, capability=capability).observe(seconds)
