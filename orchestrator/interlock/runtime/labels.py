"""Labelled Prometheus metric children, looked up once per label set.

prometheus_client's ``labels()`` checks its arguments and takes a lock on every call; the
orchestrator's metrics call it for several records of every run. Label sets are bounded
(workflows, states, capabilities, reasons), so the children are kept in a dict.
"""

from __future__ import annotations

from typing import Any

KEPT = 4_096
"""Children kept at hand (all of them are forgotten past this, then found again)."""


class Children:
    """``children(metric, *values)`` is ``metric.labels(*values)`` (values in the order
    of the metric's label names), looked up once per label set."""

    def __init__(self) -> None:
        self._found: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)  # the metrics live as long as this cache
        child = self._found.get(key)
        if child is None:
            if len(self._found) > KEPT:
                self._found.clear()
            child = self._found[key] = metric.labels(*values)
        return child
