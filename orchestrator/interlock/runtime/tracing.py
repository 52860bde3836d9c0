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
            process <prefix>.cap.<name> consumer, in the agent worker (see WorkerTracer)

A span is emitted when the record that ends it passes the relay (every appended record
does, once, whoever appended it), never while a log is folded (replay, rebuild after a
restart). Exporting follows the standard
``OTEL_*`` variables and is off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_TRACES_EXPORTER``) is set; OTLP needs the ``interlock[otlp]`` extra.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from interlock.core import events as ev
from interlock.runtime.cloudevents_nats import CloudEvent
from interlock.runtime.metrics import RunTracker, RunView, Visit, parse_time
from interlock.runtime.observe import OrchestratorObserver
from interlock.runtime.subjects import Subjects
from interlock.sdk.observe import Outcome, WorkerObserver

log = logging.getLogger("interlock.tracing")

TRACER_NAME = "interlock"
DEFAULT_SUBJECTS = Subjects()
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


# --- ids ------------------------------------------------------------------------------


def _hash(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(parts).encode()).digest()


def trace_id_for(run_id: str) -> int:
    """The trace id of a run that no traceparent names: the same after every restart."""
    return int.from_bytes(_hash("trace", run_id)[:16], "big") or 1


def span_id_for(*parts: str) -> int:
    """A span id that every replica computes alike from what the log names."""
    return int.from_bytes(_hash("span", *parts)[:8], "big") or 1


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The span context a W3C ``traceparent`` names (None when absent or malformed)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m.group(1) == "ff":
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(m.group(4), 16))
    )


def format_traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _parent_context(parent: SpanContext | None) -> otel_context.Context:
    """A context whose current span is ``parent``; an empty one (a new trace) without it."""
    if parent is None:
        return otel_context.Context()
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


_next_ids: contextvars.ContextVar[tuple[int | None, int | None]] = contextvars.ContextVar(
    "interlock_next_span_ids", default=(None, None)
)


class DerivedIds(IdGenerator):
    """Random ids, except inside :func:`_ids`, where the caller names them."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        return _next_ids.get()[1] or self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return _next_ids.get()[0] or self._random.generate_trace_id()


@contextmanager
def _ids(trace_id: int | None = None, span_id: int | None = None) -> Iterator[None]:
    token = _next_ids.set((trace_id, span_id))
    try:
        yield
    finally:
        _next_ids.reset(token)


# --- providers ------------------------------------------------------------------------


def make_tracer_provider(
    service_name: str,
    *,
    exporter: SpanExporter | None = None,
    processor: SpanProcessor | None = None,
    environ: Mapping[str, str] | None = None,
) -> TracerProvider:
    """A tracer provider whose span ids can be derived (needed by the run tracer).

    ``exporter`` is wrapped in a batch processor; pass ``processor`` to choose another
    (tests use a ``SimpleSpanProcessor`` over an in-memory exporter).
    """
    env = os.environ if environ is None else environ
    name = env.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(
        resource=Resource.create({"service.name": name}), id_generator=DerivedIds()
    )
    if processor is not None:
        provider.add_span_processor(processor)
    elif exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer_provider_from_env(
    service_name: str, environ: Mapping[str, str] | None = None
) -> TracerProvider | None:
    """A provider exporting as the ``OTEL_*`` variables say, or None when tracing is off.

    On when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``) or an OTLP
    endpoint is set; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it
    off. The OTLP protocol follows ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``
    (``http/protobuf`` by default, or ``grpc``); the exporters read their own variables
    (endpoint, headers, timeout), and the batch processor its ``OTEL_BSP_*``.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names:
        names = ["otlp"] if endpoint else []
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "none":
            continue
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporter = _otlp_exporter(env)
            if exporter is not None:
                exporters.append(exporter)
        else:
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r ignored", name)
    if not exporters:
        return None
    provider = make_tracer_provider(service_name, environ=env)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter | None:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            grpc: SpanExporter = GrpcExporter()
            return grpc
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        http: SpanExporter = HttpExporter()
        return http
    except ImportError:
        log.error(
            "tracing is configured (OTLP, %s) but the exporter is not installed: "
            "pip install 'interlock[otlp]'; running without tracing",
            protocol,
        )
        return None


def _ns(text: str) -> int:
    seconds = parse_time(text)
    return int(seconds * 1e9) if seconds else time.time_ns()


_NATS = {"messaging.system": "nats"}


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
        return _parent_context(SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags))

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
        elif isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
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
        with _ids(trace_id, self.state_span_id(run.run_id, visit.seq)):
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
            error_class = "cancelled"
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
        with _ids(trace_id, self.action_span_id(action_id, attempt)):
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
        self, run: RunView, record: ev.RunCompleted | ev.RunFailed | ev.RunCancelled
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
                error_class="cancelled",
                outcome="abandoned",
            )
        self._end_visit(
            run, record.time, error=None if isinstance(record, ev.RunCompleted) else error
        )
        trace_id, remote_parent, _ = self.run_root(run.run_id, run.traceparent)
        context = _parent_context(remote_parent)
        status = record_type_status(record)
        with _ids(trace_id, self.run_span_id(run.run_id)):
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
                **_NATS,
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


# --- agent workers --------------------------------------------------------------------


def _consumer_name(capability: str) -> str:
    from interlock.sdk.protocol import consumer_name

    return consumer_name(capability)


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
        context = _parent_context(parent)
        destination = self._subjects.capability(capability)
        span = self._tracer.start_span(
            f"process {destination}",
            context=context,
            kind=SpanKind.CONSUMER,
            attributes={
                **_NATS,
                "messaging.destination.name": destination,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.consumer.group.name": _consumer_name(capability),
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
        except Exception:
            log.debug("task span context was not current when the task finished")
