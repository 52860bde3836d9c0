"""Tracing shared by the orchestrator and the agent workers: W3C ``traceparent`` on NATS
messages, span ids derived from what the log names, and tracer providers from the standard
``OTEL_*`` variables. (The spans themselves: :mod:`interlock.runtime.tracing` for runs,
:mod:`interlock.sdk.tracing` for tasks in a worker.)"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanContext, TraceFlags

log = logging.getLogger("interlock.tracing")

TRACER_NAME = "interlock"
NATS_ATTRIBUTES = {"messaging.system": "nats"}
"""Attributes of every messaging span."""
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


def trace_context(value: str | None) -> str | None:
    """``value`` as a run keeps and hands on a trace context it was given: a W3C
    ``traceparent`` of its four fields, lower case, or None. What comes with an event is
    its publisher's text, kept in the run's log and sent with every task of the run to
    its agents, and read into the console's trace link: junk there (a path and a query,
    kilobytes) went everywhere the run's trace goes."""
    ctx = parse_traceparent(value)
    return None if ctx is None else format_traceparent(ctx)


def format_traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_context(parent: SpanContext | None) -> otel_context.Context:
    """A context whose current span is ``parent``; an empty one (a new trace) without it."""
    if parent is None:
        return otel_context.Context()
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


_next_ids: contextvars.ContextVar[tuple[int | None, int | None]] = contextvars.ContextVar(
    "interlock_next_span_ids", default=(None, None)
)


class DerivedIds(IdGenerator):
    """Random ids, except inside :func:`derived_ids`, where the caller names them."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        return _next_ids.get()[1] or self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return _next_ids.get()[0] or self._random.generate_trace_id()


@contextmanager
def derived_ids(trace_id: int | None = None, span_id: int | None = None) -> Iterator[None]:
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
    exporter: SpanExporter
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            exporter = GrpcExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            exporter = HttpExporter()
    except ImportError:
        # An expected failure: no traceback.
        log.error(  # noqa: TRY400
            "tracing is configured (OTLP, %s) but the exporter is not installed: "
            "pip install 'interlock[otlp]'; running without tracing",
            protocol,
        )
        return None
    return exporter
