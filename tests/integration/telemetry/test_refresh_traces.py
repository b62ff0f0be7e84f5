"""OpenTelemetry: one trace per policy refresh, a span per step and per call to Dynamo, and a
`traceparent` on every call the control plane's client sends — checked against an in-memory
span exporter and the headers aiohttp really sent, over the simulated fleet."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id

from controlplane import telemetry
from controlplane.audit.models import AuditEvent
from controlplane.dynamo.http import USER_AGENT
from controlplane.logging import StructuredFormatter
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import JournalEntry, RefreshState
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    plan,
    run_inline,
    sync_workers,
)

pytestmark = pytest.mark.django_db

PHASES = ["gate", "resolve", "pause", "update", "flush", "resume_engines", "verify", "reopen"]


@pytest.fixture
def spans(settings):
    exporter = InMemorySpanExporter()
    telemetry.install(SimpleSpanProcessor(exporter))
    settings.OTEL_TRACES_ENABLED = True
    yield exporter
    exporter.shutdown()  # the provider stays for the process; later tests run with tracing off


@pytest.fixture
def sent(monkeypatch):
    """(method, url, headers) of every request our Dynamo client put on the wire."""
    calls: list[tuple[str, str, dict[str, str]]] = []
    original = aiohttp.ClientSession.__init__

    async def on_headers_sent(session, ctx, params):
        headers = {k.lower(): v for k, v in params.headers.items()}
        if headers.get("user-agent") == USER_AGENT:
            calls.append((params.method, str(params.url), headers))

    def init(self, *args, trace_configs=None, **kwargs):
        config = aiohttp.TraceConfig()
        config.on_request_headers_sent.append(on_headers_sent)
        original(self, *args, trace_configs=[*(trace_configs or []), config], **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", init)
    return calls


@pytest.fixture
def source(simfleet_factory):
    fleet = simfleet_factory(fleet_config(4))
    return fleet, make_source(fleet)


def run_traced(source, user, spans, sent, **kwargs):
    """Plan (its discovery refresh is a trace of its own), then clear, then run the refresh."""
    refresh = plan(source, user, "v2", **kwargs)
    intents.start_policy_refresh(refresh, actor=actor_for(user), enqueue=False)
    spans.clear()
    sent.clear()
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    return refresh


def test_a_refresh_is_one_trace_with_step_and_call_spans(spans, sent, source, operator, client):
    _fleet, source = source
    refresh = run_traced(source, operator, spans, sent, verification={"generation": True})
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason

    assert refresh.trace_id
    finished = spans.get_finished_spans()
    run = [s for s in finished if s.name == "policy refresh"]
    assert len(run) == 1 and run[0].parent is None
    assert {format_trace_id(s.context.trace_id) for s in finished} == {refresh.trace_id}
    trace_id = format_trace_id(run[0].context.trace_id)
    assert trace_id == refresh.trace_id
    ours = [s for s in finished if format_trace_id(s.context.trace_id) == trace_id]

    steps = {s.name.removeprefix("step "): s for s in ours if s.name.startswith("step ")}
    assert sorted(steps) == sorted(PHASES)
    assert all(s.parent.span_id == run[0].context.span_id for s in steps.values())

    calls = [s for s in ours if s.kind == SpanKind.CLIENT]
    step_ids = {s.context.span_id for s in steps.values()}
    assert calls and all(s.parent.span_id in step_ids for s in calls)
    # Every journaled admin or generation call has its span, under the step it belongs to.
    # (The agreement check is journaled too, but calls nobody.)
    for entry in JournalEntry.objects.filter(refresh=refresh, url__startswith="http"):
        matching = [
            s
            for s in calls
            if s.attributes["url.full"].startswith(entry.url)
            and s.parent.span_id == steps[entry.step].context.span_id
        ]
        assert matching, (entry.step, entry.url)
    assert any(s.attributes["url.full"].endswith("/v1/completions") for s in calls)

    # Every request on the wire carried this trace, naming its own client span as parent.
    call_span_ids = {format_span_id(s.context.span_id) for s in calls}
    refresh_calls = [c for c in sent if c[1] != source.listener_url]
    assert len(sent) >= JournalEntry.objects.filter(refresh=refresh, url__startswith="http").count()
    for method, url, headers in sent:
        version, sent_trace, parent_span, _flags = headers["traceparent"].split("-")
        assert (version, sent_trace) == ("00", trace_id), (method, url)
        assert parent_span in call_span_ids
    assert refresh_calls

    # Audit rows written by the executor carry the trace id; the refresh page shows it.
    executor_rows = AuditEvent.objects.filter(
        target_id=str(refresh.pk), actor_label="policy-refresh executor"
    )
    assert executor_rows.exists()
    assert {e.details.get("trace_id") for e in executor_rows} == {trace_id}
    client.force_login(operator)
    page = client.get(f"/refreshes/{refresh.pk}/").content.decode()
    assert trace_id in page


def test_a_retry_joins_the_trace_of_the_first_run(spans, sent, source, operator):
    fleet, source = source
    bad = fleet.workers()[0]["key"]
    fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
    refresh = run_traced(source, operator, spans, sent)
    assert refresh.state == RefreshState.HELD
    first = spans.get_finished_spans()
    [update] = [s for s in first if s.name == "step update"]
    assert update.status.status_code == StatusCode.ERROR
    assert "disk full" in update.status.description

    fleet.clear_faults(bad)
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    sent.clear()
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason

    everything = spans.get_finished_spans()
    [root] = [s for s in everything if s.parent is None and s.name.startswith("policy refresh")]
    [second_run] = [s for s in everything if s.name == "policy refresh run"]
    assert second_run.context.trace_id == root.context.trace_id
    assert second_run.parent.span_id == root.context.span_id
    assert {format_trace_id(s.context.trace_id) for s in everything} == {refresh.trace_id}
    assert sent and all(h["traceparent"].split("-")[1] == refresh.trace_id for _, _, h in sent)


def test_tracing_off_sends_no_traceparent_and_stores_no_trace(sent, source, operator, settings):
    settings.OTEL_TRACES_ENABLED = False
    _fleet, source = source
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED
    assert refresh.trace_context == "" and refresh.trace_id == ""
    assert sent and all("traceparent" not in h for _, _, h in sent)


def test_a_discovery_refresh_is_a_trace_and_its_probes_carry_it(spans, sent, source):
    _fleet, source = source
    spans.clear()
    sync_workers(source)
    [root] = [s for s in spans.get_finished_spans() if s.name == "discovery refresh"]
    assert root.parent is None and root.attributes["controlplane.source"] == source.name
    trace_id = format_trace_id(root.context.trace_id)
    calls = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert len(calls) == len(sent) > 1  # the listener and one probe per worker at least
    assert all(h["traceparent"].split("-")[1] == trace_id for _, _, h in sent)


def test_log_lines_inside_a_trace_carry_its_id(spans):
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    with telemetry.run_span("some work") as span:
        inside = json.loads(StructuredFormatter().format(record))
    outside = json.loads(StructuredFormatter().format(record))
    assert inside["trace_id"] == format_trace_id(span.get_span_context().trace_id)
    assert "trace_id" not in outside
