"""One trace per policy refresh, however many executor runs it takes.

The first run starts the root span and stores its `traceparent` on the refresh; a retry, a
takeover after a crash or a release, in whichever Celery task, runs as a child of that root, so
the whole refresh reads as one trace. Inside a run each step is a span (`step_span`), and each
call to Dynamo a client span (`dynamo/tracing.py`). Off (no OTLP endpoint), nothing happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.trace import Span

from controlplane import telemetry
from controlplane.dynamo import trace_join
from controlplane.refresh.models import PolicyRefresh, Quarantine


@contextmanager
def refresh_trace(refresh_id: int) -> Iterator[None]:
    """The run's trace span, and the trace-join headers of every call it sends
    (`dynamo/trace_join.py`: the refresh's target version, `refresh-<id>`)."""
    target = PolicyRefresh.objects.filter(pk=refresh_id).values_list("target", flat=True).first()
    version = (target or {}).get("weight_version")
    with trace_join.serving(version, f"refresh-{refresh_id}"), _run_span(refresh_id):
        yield


@contextmanager
def quarantine_trace(quarantine_id: int) -> Iterator[None]:
    """The trace-join headers of a quarantine catch-up's calls: its target version."""
    target = Quarantine.objects.filter(pk=quarantine_id).values_list("target", flat=True).first()
    with trace_join.serving((target or {}).get("weight_version"), f"quarantine-{quarantine_id}"):
        yield


@contextmanager
def _run_span(refresh_id: int) -> Iterator[None]:
    if not telemetry.enabled():
        yield
        return
    row = PolicyRefresh.objects.filter(pk=refresh_id).values("trace_context", "source__name").get()
    stored = row["trace_context"]
    name = "policy refresh" if not stored else "policy refresh run"
    attributes = {
        "controlplane.policy_refresh.id": refresh_id,
        "controlplane.source": row["source__name"],
    }
    with telemetry.run_span(name, parent=stored, attributes=attributes) as span:
        if not stored and span is not None:
            # Conditional: of two runs racing to be first, one trace wins and both join it next.
            PolicyRefresh.objects.filter(pk=refresh_id, trace_context="").update(
                trace_context=telemetry.traceparent(span)
            )
        yield


@contextmanager
def step_span(step: str, attempt: int) -> Iterator[Span | None]:
    with telemetry.span(
        f"step {step}",
        attributes={"controlplane.step": step, "controlplane.step.attempt": attempt},
    ) as span:
        yield span
