"""The consumer side of a run's trace: a ``process`` span around each task a worker runs,
child of the orchestrator's ``send`` span (its ``traceparent`` travels with the request)."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import consumer_name
from interlock.transport.tracing import (
    NATS_ATTRIBUTES,
    TRACER_NAME,
    parent_context,
    parse_traceparent,
)

from .observe import Outcome, WorkerObserver

log = logging.getLogger("interlock.tracing")

DEFAULT_SUBJECTS = Subjects()


_processing: contextvars.ContextVar[tuple[trace.Span, object] | None] = contextvars.ContextVar(
    "interlock_task_span", default=None
)


class WorkerTracer(WorkerObserver):
    """A consumer (``process``) span around each task, child of the dispatch's producer span.

    The span is current while the handler runs, so spans a handler starts are its children.
    """

    def __init__(
        self, provider: TracerProvider, worker: str, subjects: Subjects = DEFAULT_SUBJECTS
    ) -> None:
        self._tracer = provider.get_tracer(TRACER_NAME)
        self._worker = worker
        self._subjects = subjects

    def task_received(
        self, capability: str, event: CloudEvent, headers: Mapping[str, str] | None
    ) -> None:
        """A task request was decoded: open its span (in the task's own context)."""
        hdrs = headers or {}
        parent = parse_traceparent(hdrs.get("traceparent")) or parse_traceparent(
            event.extensions.get("traceparent")
        )
        context = parent_context(parent)
        destination = self._subjects.capability(capability)
        span = self._tracer.start_span(
            f"process {destination}",
            context=context,
            kind=SpanKind.CONSUMER,
            attributes={
                **NATS_ATTRIBUTES,
                "messaging.destination.name": destination,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.consumer.group.name": consumer_name(capability),
                "messaging.message.id": hdrs.get("Nats-Msg-Id", event.id),
                "cloudevents.event_id": event.id,
                "cloudevents.event_type": event.type,
                "interlock.run.id": event.extensions.get("runid", ""),
                "interlock.action.id": event.extensions.get("actionid", ""),
                "interlock.capability": capability,
                "interlock.worker": self._worker,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        _processing.set((span, token))

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        current = _processing.get()
        if current is None:
            return
        _processing.set(None)
        span, token = current
        span.set_attribute("interlock.task.outcome", str(outcome))
        if error_class:
            span.set_attribute("error.type", error_class)
        if outcome in (Outcome.FAILED, Outcome.REJECTED):
            span.set_status(Status(StatusCode.ERROR, error_class or str(outcome)))
        span.end()
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
        # Telemetry must never fail a task.
        except Exception:  # noqa: BLE001
            log.debug("task span context was not current when the task finished")
