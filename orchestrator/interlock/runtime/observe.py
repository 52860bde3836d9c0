"""Hooks for watching the orchestrator (metrics, tracing, tests) without touching its loop.

Telemetry wraps the shell: the orchestrator calls these hooks at its edges and knows
nothing of Prometheus or OpenTelemetry. Calls happen on the event loop; they must be quick,
and an exception raised in one is logged and otherwise ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from interlock.core import events as ev
from interlock.transport.observing import Fanout

log = logging.getLogger("interlock.observe")


class OrchestratorObserver:
    """Subclass and override what you need; pass instances to ``Orchestrator(observers=)``."""

    def appended(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        """A live decision's records were appended to a run's log (never called on replay)."""

    def relayed(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        """The relay acted on these records of a run (in log order) and acknowledged them.

        Every appended record passes the relay once across all replicas, whoever appended
        it (an orchestrator, the CLI): the place to count and trace runs. Records whose
        effects failed are not reported here; the replica that redoes them reports them.
        A record may still come twice when an acknowledgement is lost with a server
        (at-least-once); folding a log for a rebuild never comes here.
        """

    def dispatched(self, record: ev.ActionRequested, headers: dict[str, str]) -> None:
        """A capability request was published; ``headers`` may be extended before publishing
        (a tracer adds ``traceparent`` here)."""

    def dead_lettered(self, reason: str) -> None:
        """A message was moved to the dead-letter stream."""

    def answer_late(self, reason: str) -> None:
        """An answer came for an attempt the run itself stopped waiting for (``reason``:
        ``action-cancelled``, ``attempt-timed-out``, ``run-ended``); it was dropped."""

    def unrouted(self, event_type: str) -> None:
        """An inbound event started no run and reached no run."""

    def redelivered(self, consumer: str) -> None:
        """A message arrived again (its earlier delivery was not acknowledged)."""

    def deferred(self) -> None:
        """An inbound event went back to JetStream for a while: its publisher's share of
        the costly-evaluation thread was full (``interlock.runtime.fairness``)."""

    def conflict(self) -> None:
        """An optimistic append lost and the decision was made again."""

    def trigger_flow(self, what: str, detail: str) -> None:
        """A trigger's window or rate did ``what`` (:mod:`interlock.runtime.triggermetrics`)."""

    def history_near(self, run_id: str, workflow: str, limit: str) -> None:
        """A run's log reached 80% of its history ``limit`` (``history.max_records`` or
        ``history.max_bytes``): continuing it as new is suggested."""


_HOOKS = (
    "appended",
    "relayed",
    "dispatched",
    "dead_lettered",
    "answer_late",
    "unrouted",
    "redelivered",
    "deferred",
    "conflict",
    "trigger_flow",
    "history_near",
)


class Observers(OrchestratorObserver):
    """Fans each call out to several observers, isolating their failures
    (:class:`~interlock.transport.observing.Fanout`).

    A hook an observer leaves as :class:`OrchestratorObserver`'s (which does nothing) is
    not called at all: the orchestrator calls some of them several times a run.
    """

    def __init__(self, observers: Sequence[OrchestratorObserver] = ()) -> None:
        self._fan = Fanout(OrchestratorObserver, _HOOKS, log, observers)

    def add(self, observer: OrchestratorObserver) -> None:
        self._fan.add(observer)

    def appended(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        self._fan.call("appended", run_id, records)

    def relayed(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        self._fan.call("relayed", run_id, records)

    def dispatched(self, record: ev.ActionRequested, headers: dict[str, str]) -> None:
        self._fan.call("dispatched", record, headers)

    def dead_lettered(self, reason: str) -> None:
        self._fan.call("dead_lettered", reason)

    def answer_late(self, reason: str) -> None:
        self._fan.call("answer_late", reason)

    def unrouted(self, event_type: str) -> None:
        self._fan.call("unrouted", event_type)

    def redelivered(self, consumer: str) -> None:
        self._fan.call("redelivered", consumer)

    def deferred(self) -> None:
        self._fan.call("deferred")

    def conflict(self) -> None:
        self._fan.call("conflict")

    def trigger_flow(self, what: str, detail: str) -> None:
        self._fan.call("trigger_flow", what, detail)

    def history_near(self, run_id: str, workflow: str, limit: str) -> None:
        self._fan.call("history_near", run_id, workflow, limit)
