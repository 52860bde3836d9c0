"""The metrics of runs that live long: logs that neared a history limit (continuing as new
is suggested) and runs continued as new, by workflow (never by run)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from interlock.runtime.plaincounts import PlainCounter


class ChainMetrics:
    """The counters, and what each observation adds to."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.history_limit_near = PlainCounter(
            "interlock_history_limit_near",
            "Runs whose log reached 80% of a history limit: continuing as new is suggested",
            ["workflow", "limit"],
            registry=registry,
        )
        self.runs_continued = PlainCounter(
            "interlock_runs_continued",
            "Runs continued as new, by why (transition, history.max_records, ...max_bytes)",
            ["workflow", "reason"],
            registry=registry,
        )

    def near(self, workflow: str, limit: str) -> None:
        self.history_limit_near.labels(workflow, limit).inc()

    def continued(self, workflow: str, reason: str) -> None:
        self.runs_continued.labels(workflow, reason).inc()
