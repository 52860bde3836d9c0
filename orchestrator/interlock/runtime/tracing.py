"""OpenTelemetry tracing of runs: one trace per run, joined across NATS by ``traceparent``.

The trace of a run is the trace of the event that triggered it (its ``traceparent``, kept
in the run's first record), or a new trace whose id derives from the run id. Span ids
derive from what the log names (run id, the log position of a ``state.entered`` record, an
action id), so whichever replica makes a decision, and however often orchestrators
restart, the spans of one run fit into one tree:

    run <workflow>                      internal, from run.started to the terminal record
      state <name>                      internal, one per visit; transitions, guard
                                        failures, received events and timers are its
                                        span events
        action <capability>             internal, one per attempt, from
                                        action.requested to its answer
          send <prefix>.cap.<name>      producer, at each dispatch (traceparent injected)
            process <prefix>.cap.<name> consumer, in the agent worker (interlock.sdk.tracing)

A span is emitted when the record that ends it passes the relay (every appended record
does, once, whoever appended it), never while a log is folded (replay, rebuild after a
restart). Exporting follows the standard
``OTEL_*`` variables and is off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_TRACES_EXPORTER``) is set; OTLP needs the ``interlock[otlp]`` extra.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from interlock.core import events as ev
from interlock.core.vocabulary import ErrorClass
from interlock.runtime.metrics import RunTracker
from interlock.runtime.observe import OrchestratorObserver
from interlock.runtime.runview import RunView, Visit, epoch_seconds
from interlock.transport.subjects import Subjects
from interlock.transport.tracing import (
    NATS_ATTRIBUTES,
    TRACER_NAME,
    derived_ids,
    format_traceparent,
    make_tracer_provider,
    parent_context,
    parse_traceparent,
    span_id_for,
    trace_id_for,
    tracer_provider_from_env,
)

__all__ = [
    "OrchestratorTracer",
    "format_traceparent",
    "make_tracer_provider",
    "orchestrator_tracer",
    "parse_traceparent",
    "span_id_for",
    "trace_id_for",
    "tracer_provider_from_env",
]

DEFAULT_SUBJECTS = Subjects()


def _ns(text: str) -> int:
    seconds = epoch_seconds(text)
    return int(seconds * 1e9) if seconds else time.time_ns()


# --- the orchestrator -----------------------------------------------------------------


class OrchestratorTracer(OrchestratorObserver):
    """Spans of runs, states and actions, and producer spans at dispatch.

    Register it as an observer of the orchestrator (for ``dispatched``) and as a sink of
    the :class:`RunTracker` whose view of runs it reads.
    """

    def __init__(
        self, provider: TracerProvider, tracker: RunTracker, subjects: Subjects = DEFAULT_SUBJECTS
    ) -> None:
        self._tracer = provider.get_tracer(TRACER_NAME)
        self._tracker = tracker
        self._subjects = subjects

    # -- contexts -----------------------------------------------------------------------

    @staticmethod
    def run_root(
        run_id: str, traceparent: str | None
    ) -> tuple[int, SpanContext | None, TraceFlags]:
        """(trace id, remote parent of the run span, flags) of a run's trace."""
        parent = parse_traceparent(traceparent)
        if parent is not None:
            return parent.trace_id, parent, parent.trace_flags
        return trace_id_for(run_id), None, TraceFlags(TraceFlags.SAMPLED)

    def _parent(self, run_id: str, traceparent: str | None, span_id: int) -> Any:
        trace_id, _, flags = self.run_root(run_id, traceparent)
        return parent_context(SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags))

    @staticmethod
    def run_span_id(run_id: str) -> int:
        return span_id_for(run_id, "run")

    @staticmethod
    def state_span_id(run_id: str, visit_seq: int) -> int:
        return span_id_for(run_id, "state", str(visit_seq))

    @staticmethod
    def action_span_id(action_id: str, attempt: int = 1) -> int:
        """One span per attempt: a retried action keeps its id and counts attempts."""
        return span_id_for(action_id, str(attempt), "action")

    def _attrs(self, run: RunView, **more: Any) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "interlock.run.id": run.run_id,
            "interlock.workflow": run.workflow,
            "interlock.namespace": run.namespace,
        }
        attrs.update({k.replace("__", "."): v for k, v in more.items() if v is not None})
        return attrs

    # -- records ------------------------------------------------------------------------

    def on_record(self, run: RunView, record: ev.AnyRecord) -> None:
        if isinstance(record, ev.RunStarted):
            return
        if isinstance(record, ev.TransitionFired):
            d = record.data
            event = (
                record.time,
                "transition",
                {
                    "interlock.transition.from": d.from_state,
                    "interlock.transition.to": d.to_state,
                    "interlock.transition.index": d.transition,
                    "cloudevents.event_type": d.event_type,
                },
            )
            self._end_visit(run, record.time, extra=event)
        elif isinstance(record, ev.ActionCompleted | ev.ActionFailed | ev.ActionCancelled):
            self._end_action(run, record)
        elif isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled | ev.RunContinued):
            self._end_run(run, record)

    def _end_visit(
        self,
        run: RunView,
        end: str,
        *,
        extra: tuple[str, str, dict[str, Any]] | None = None,
        error: str | None = None,
    ) -> None:
        visit: Visit | None = run.visit
        if visit is None:
            return
        parent = self._parent(run.run_id, run.traceparent, self.run_span_id(run.run_id))
        trace_id, _, _ = self.run_root(run.run_id, run.traceparent)
        with derived_ids(trace_id, self.state_span_id(run.run_id, visit.seq)):
            span = self._tracer.start_span(
                f"state {visit.state}",
                context=parent,
                kind=SpanKind.INTERNAL,
                attributes=self._attrs(run, interlock__state=visit.state),
                start_time=_ns(visit.entered_at),
            )
        for when, name, attrs in [*visit.notes, *([extra] if extra else [])]:
            span.add_event(name, attributes=attrs, timestamp=_ns(when))
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))

    def _end_action(
        self, run: RunView, record: ev.ActionCompleted | ev.ActionFailed | ev.ActionCancelled
    ) -> None:
        pending = run.pending.get(record.data.action_id)
        if pending is None:
            return
        error = error_class = None
        if isinstance(record, ev.ActionFailed):
            error_class = record.data.error.error_class
            error = f"{error_class}: {record.data.error.message}"
            outcome = "failed"
        elif isinstance(record, ev.ActionCancelled):
            error_class = ErrorClass.CANCELLED
            error = f"cancelled: {record.data.reason}" if record.data.reason else "cancelled"
            outcome = "cancelled"
        else:
            outcome = record.data.event_type
        self._action_span(
            run,
            pending.action_id,
            pending.capability,
            pending.attempt,
            pending.visit_seq,
            pending.requested_at,
            record.time,
            error=error,
            error_class=error_class,
            outcome=outcome,
        )

    def _action_span(
        self,
        run: RunView,
        action_id: str,
        capability: str,
        attempt: int,
        visit_seq: int,
        start: str,
        end: str,
        *,
        error: str | None,
        error_class: str | None,
        outcome: str,
    ) -> None:
        parent = self._parent(
            run.run_id, run.traceparent, self.state_span_id(run.run_id, visit_seq)
        )
        trace_id, _, _ = self.run_root(run.run_id, run.traceparent)
        with derived_ids(trace_id, self.action_span_id(action_id, attempt)):
            span = self._tracer.start_span(
                f"action {capability}",
                context=parent,
                kind=SpanKind.INTERNAL,
                attributes=self._attrs(
                    run,
                    interlock__action__id=action_id,
                    interlock__capability=capability,
                    interlock__action__attempt=attempt,
                    interlock__action__outcome=outcome,
                    error__type=error_class,
                ),
                start_time=_ns(start),
            )
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))

    def _end_run(
        self,
        run: RunView,
        record: ev.RunCompleted | ev.RunFailed | ev.RunCancelled | ev.RunContinued,
    ) -> None:
        error = None
        if isinstance(record, ev.RunFailed):
            error = f"{record.data.error.error_class}: {record.data.error.message}"
        elif isinstance(record, ev.RunCancelled):
            error = f"cancelled: {record.data.reason}" if record.data.reason else "cancelled"
        for pending in list(run.pending.values()):
            self._action_span(
                run,
                pending.action_id,
                pending.capability,
                pending.attempt,
                pending.visit_seq,
                pending.requested_at,
                record.time,
                error="the run ended first",
                error_class=ErrorClass.CANCELLED,
                outcome="abandoned",
            )
        self._end_visit(
            run, record.time, error=None if isinstance(record, ev.RunCompleted) else error
        )
        trace_id, remote_parent, _ = self.run_root(run.run_id, run.traceparent)
        context = parent_context(remote_parent)
        status = record_type_status(record)
        with derived_ids(trace_id, self.run_span_id(run.run_id)):
            span = self._tracer.start_span(
                f"run {run.workflow or 'unknown'}",
                context=context,
                kind=SpanKind.INTERNAL,
                attributes=self._attrs(
                    run, interlock__workflow__version=run.version, interlock__run__status=status
                ),
                start_time=_ns(run.started_at or record.time),
            )
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(record.time))

    # -- dispatch -----------------------------------------------------------------------

    def dispatched(self, record: ev.ActionRequested, headers: dict[str, str]) -> None:
        d = record.data
        run_id = record.subject
        view = self._tracker.view(run_id)
        # The view is missing when another replica made the decision; the record's own
        # traceparent (when the core stamps one) then names the run's trace.
        traceparent = view.traceparent if view is not None else record.traceparent
        destination = self._subjects.capability(d.capability)
        parent = self._parent(run_id, traceparent, self.action_span_id(d.action_id, d.attempt))
        span = self._tracer.start_span(
            f"send {destination}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes={
                **NATS_ATTRIBUTES,
                "messaging.destination.name": destination,
                "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
                "messaging.message.id": headers.get("Nats-Msg-Id", d.action_id),
                "cloudevents.event_id": d.action_id,
                "cloudevents.event_type": "io.interlock.task.requested",
                "interlock.run.id": run_id,
                "interlock.action.id": d.action_id,
                "interlock.capability": d.capability,
                "interlock.action.attempt": d.attempt,
            },
        )
        headers["traceparent"] = format_traceparent(span.get_span_context())
        span.end()


def record_type_status(record: ev.Record) -> str:
    return ev.record_type(record).removeprefix(ev.PREFIX + "run.")


def orchestrator_tracer(
    provider: TracerProvider, tracker: RunTracker, subjects: Subjects = DEFAULT_SUBJECTS
) -> OrchestratorTracer:
    """A tracer of runs registered as a sink of ``tracker``."""
    tracer = OrchestratorTracer(provider, tracker, subjects)
    tracker.add_sink(tracer)
    return tracer
