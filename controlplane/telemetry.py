"""OpenTelemetry traces, joined to Dynamo's: off unless configured (docs/operate/telemetry.md).

On when `OTEL_TRACES_ENABLED` is true, which it is by default as soon as an OTLP endpoint is
set (`OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT`; the exporter reads the standard
`OTEL_*` variables itself). Then each process sets up its tracer provider on first use, with a
batching OTLP/HTTP exporter: nothing to hook into Daphne, uvicorn or Celery start-up, and a
forked Celery child gets fresh exporter threads from the SDK itself.

What is traced: one trace per policy refresh (`refresh/executor/tracing.py`), a span per step
and a client span per call to Dynamo carrying `traceparent` (`dynamo/tracing.py`), so Dynamo's
own spans for a generation check or an admin call join the refresh's trace. Audit rows written
inside a trace carry its id (`audit/recorder.py`).

Off, the functions here cost one settings read and start nothing; the `dynamo` package sees no
current span and sends no header.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from controlplane.dynamo import tracing as dynamo_tracing

TRACER_NAME = "controlplane"
_W3C = TraceContextTextMapPropagator()
_lock = threading.Lock()
_provider: TracerProvider | None = None


def enabled() -> bool:
    return bool(getattr(settings, "OTEL_TRACES_ENABLED", False))


def install(processor: SpanProcessor | None = None) -> TracerProvider:
    """Set this process's tracer provider (once) and add `processor` to it.

    Default processor: batching OTLP/HTTP export. Tests pass a simple processor around an
    in-memory exporter instead.
    """
    global _provider
    with _lock:
        if _provider is None:
            resource = Resource.create({SERVICE_NAME: settings.OTEL_SERVICE_NAME})
            _provider = TracerProvider(resource=resource)
            trace.set_tracer_provider(_provider)
            dynamo_tracing.activate()
            if processor is None:
                # Imported here: only a process that really exports pays for the exporter.
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                processor = BatchSpanProcessor(OTLPSpanExporter())
        if processor is not None:
            _provider.add_span_processor(processor)
        return _provider


def tracer() -> trace.Tracer:
    if _provider is None:
        install()
    return trace.get_tracer(TRACER_NAME)


def traceparent(span: Span) -> str:
    """The W3C `traceparent` value that makes a later span a child of `span`."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def trace_id_of(traceparent_value: str) -> str:
    """The trace id (32 hex digits) of a stored `traceparent`, or "" if it is not one."""
    parts = traceparent_value.split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        try:
            int(parts[1], 16)
        except ValueError:
            return ""
        return parts[1]
    return ""


def current_trace_id() -> str:
    """The id of the trace the caller runs in, or "" outside one (or with tracing off)."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return ""
    return trace.format_trace_id(span_context.trace_id)


@contextmanager
def run_span(
    name: str, *, parent: str = "", attributes: Mapping[str, Any] | None = None
) -> Iterator[Span | None]:
    """A span for one run of a piece of work: a child of `parent` (a stored `traceparent`: the
    trace an earlier run started) if given, else of the current span, else a new trace's root.
    Yields None with tracing off."""
    if not enabled():
        yield None
        return
    ctx = _W3C.extract({"traceparent": parent}) if parent else None
    with tracer().start_as_current_span(name, context=ctx, attributes=attributes) as span:
        yield span


@contextmanager
def span(name: str, *, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A child span of the current one; nothing outside a trace (so no stray root traces)."""
    if not enabled() or not trace.get_current_span().get_span_context().is_valid:
        yield None
        return
    with tracer().start_as_current_span(name, attributes=attributes) as child:
        yield child


def mark_failed(span: Span | None, reason: str) -> None:
    if span is not None:
        span.set_status(Status(StatusCode.ERROR, reason[:500]))
