"""What a program, the CLI and the HTTP API show of workflows, runs, agents and dead letters.

One set of shapes (msgspec Structs) for every reader: :class:`interlock.Client` returns
them, ``interlock ... --output json|yaml`` prints them, and the HTTP gateway answers with
them, so the three never disagree. Every builder here is pure: it turns what was read (a
run's log, a definition, an index entry) into a view, and does no I/O.

Encode a view with :func:`to_builtins` (plain dicts and lists, ready for JSON or YAML) or
``msgspec.json.encode``.
"""

from __future__ import annotations

from interlock.views.build import (
    describe_run,
    record_view,
    run_result,
    to_builtins,
    waiting_of,
)
from interlock.views.chains import ChainView, HistoryView
from interlock.views.eventshapes import (
    EmitResult,
    EventRefusal,
    GateView,
    SignalResult,
    StartedRun,
)
from interlock.views.listing import summary_from_index
from interlock.views.shapes import (
    AgentView,
    CapabilityView,
    DeadLetterView,
    ErrorView,
    GuardErrorView,
    MapView,
    PendingActionView,
    RunDescription,
    RunOrigin,
    RunResult,
    RunSummary,
    TimerView,
    TransitionView,
    VersionRuns,
    WaitingOn,
    WaitView,
    WorkerView,
    WorkflowDetail,
    WorkflowSummary,
)

__all__ = [
    "AgentView",
    "CapabilityView",
    "ChainView",
    "DeadLetterView",
    "EmitResult",
    "ErrorView",
    "EventRefusal",
    "GateView",
    "GuardErrorView",
    "HistoryView",
    "MapView",
    "PendingActionView",
    "RunDescription",
    "RunOrigin",
    "RunResult",
    "RunSummary",
    "SignalResult",
    "StartedRun",
    "TimerView",
    "TransitionView",
    "VersionRuns",
    "WaitView",
    "WaitingOn",
    "WorkerView",
    "WorkflowDetail",
    "WorkflowSummary",
    "describe_run",
    "record_view",
    "run_result",
    "summary_from_index",
    "to_builtins",
    "waiting_of",
]
