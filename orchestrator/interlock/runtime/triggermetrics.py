"""The metrics of triggers' flow control: events gathered into debounce and batch
windows, windows closed and the runs they started, events weighed against a rate. Totals
by kind and outcome only: a key is never a label (publishers choose keys, and labels must
stay bounded)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from interlock.runtime.plaincounts import PlainCounter

WINDOW_EVENT = "window-event"
"""An event taken into a window (detail: ``debounce`` or ``batch``)."""
WINDOW_CLOSED = "window-closed"
"""A window closed (detail: ``<kind>:<closed_by>``)."""
WINDOW_RUN = "window-run"
"""A window's run started (detail: its kind)."""
RATE = "rate"
"""An event weighed against its trigger's rate (detail: ``now``, ``queued`` or
``dropped``)."""


class TriggerFlowMetrics:
    """The counters, and what each observation adds to."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        r = registry
        self.window_events = PlainCounter(
            "interlock_trigger_window_events",
            "Events taken into debounce and batch windows",
            ["kind"],
            registry=r,
        )
        self.windows_closed = PlainCounter(
            "interlock_trigger_windows_closed",
            "Debounce and batch windows closed, by what closed them",
            ["kind", "closed_by"],
            registry=r,
        )
        self.window_runs = PlainCounter(
            "interlock_trigger_window_runs",
            "Runs started by debounce and batch windows",
            ["kind"],
            registry=r,
        )
        self.rate_events = PlainCounter(
            "interlock_trigger_rate_events",
            "Events weighed against a trigger's rate: started now, queued for later, dropped",
            ["outcome"],
            registry=r,
        )

    def count(self, what: str, detail: str) -> None:
        if what == WINDOW_EVENT:
            self.window_events.labels(detail).inc()
        elif what == WINDOW_CLOSED:
            kind, _, closed_by = detail.partition(":")
            self.windows_closed.labels(kind, closed_by).inc()
        elif what == WINDOW_RUN:
            self.window_runs.labels(detail).inc()
        elif what == RATE:
            self.rate_events.labels(detail).inc()
