"""Hooks for watching the orchestrator (metrics, tracing, tests) without touching its loop.

Telemetry wraps the shell: the orchestrator calls these hooks at its edges and knows
nothing of Prometheus or OpenTelemetry. Calls happen on the event loop; they must be quick,
and an exception raised in one is logged and otherwise ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from interlock.core import events as ev

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
)


class Observers(OrchestratorObserver):
    """Fans each call out to several observers, isolating their failures.

    Each observer's hooks are looked up once, when it is added, and a hook it leaves as
    :class:`OrchestratorObserver`'s (which does nothing) is not called at all: the
    orchestrator calls some of them several times a run.
    """

    def __init__(self, observers: Sequence[OrchestratorObserver] = ()) -> None:
        self._observers: list[OrchestratorObserver] = []
        self._hooks: dict[str, list[tuple[str, Callable[..., None]]]] = {
            name: [] for name in _HOOKS
        }
        for observer in observers:
            self.add(observer)

    def add(self, observer: OrchestratorObserver) -> None:
        self._observers.append(observer)
        for name, hooks in self._hooks.items():
            hook = getattr(observer, name)
            if getattr(hook, "__func__", None) is not getattr(OrchestratorObserver, name):
                hooks.append((type(observer).__name__, hook))

    def _each(self, name: str, *args: object) -> None:
        for owner, hook in self._hooks[name]:
            try:
                hook(*args)
            except Exception:
                log.exception("observer %s failed in %s", owner, name)

    def appended(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        for owner, hook in self._hooks["appended"]:
            try:
                hook(run_id, records)
            except Exception:
                log.exception("observer %s failed in %s", owner, "appended")

    def relayed(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        for owner, hook in self._hooks["relayed"]:
            try:
                hook(run_id, records)
            except Exception:
                log.exception("observer %s failed in %s", owner, "relayed")

    def dispatched(self, record: ev.ActionRequested, headers: dict[str, str]) -> None:
        for owner, hook in self._hooks["dispatched"]:
            try:
                hook(record, headers)
            except Exception:
                log.exception("observer %s failed in %s", owner, "dispatched")

    def dead_lettered(self, reason: str) -> None:
        self._each("dead_lettered", reason)

    def answer_late(self, reason: str) -> None:
        self._each("answer_late", reason)

    def unrouted(self, event_type: str) -> None:
        self._each("unrouted", event_type)

    def redelivered(self, consumer: str) -> None:
        self._each("redelivered", consumer)

    def deferred(self) -> None:
        self._each("deferred")

    def conflict(self) -> None:
        self._each("conflict")
