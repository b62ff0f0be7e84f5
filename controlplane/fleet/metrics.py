"""`/metrics`: Prometheus exposition through `prometheus-client`, computed from the database.

Custom collectors read the state at scrape time. Why not per-process counters (or
prometheus_client's multiprocess mode): the events happen in many processes — several ASGI
workers, Celery workers on other machines or pods, beat — that share no directory, and a scrape
reaches one web replica. The database is shared and is the truth, so every replica answers
with the same figures and no process keeps metric state. Gauges are current rows; counters
count rows that are never deleted (ended refreshes, audit events), or the rows kept where a
table is pruned (then a purge shows up as a counter reset, which `rate()` tolerates); the
discovery latency is quantiles over the last few minutes of runs, since runs are pruned.

Labels stay low-cardinality: source, namespace, state, step, action, destination or endpoint
names — never worker ids, instance ids or versions. Scrapers do not sign in, so access is
either a bearer token (`METRICS_TOKEN`: then required from every address, compared in constant
time) or, without one, the client address within `METRICS_ALLOWED_NETWORKS` (default:
loopback) — the address `controlplane.requests.client_address` derives, which believes
X-Forwarded-For only from `TRUSTED_PROXIES`, so a forged header does not make a client local.

Gate gauges read the refresh app's gates by model label (`apps.get_model`): fleet never imports
the apps built on it; those register their own collectors (`EXTRA_COLLECTORS`).
Panels built on these families: deploy/grafana/controlplane.json.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Count, Max, Q
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.audit.metrics import AuditCollector
from controlplane.fleet.models import DiscoveryRun, Source, Worker
from controlplane.notify.metrics import NotifyCollector
from controlplane.requests import client_address

DEFAULT_ALLOWED = ("127.0.0.1/32", "::1/128")
#: Discovery latency quantiles are taken over the runs of this many recent seconds.
LATENCY_WINDOW_SECONDS = 300
LATENCY_QUANTILES = (0.5, 0.9, 0.99, 1.0)

#: Collectors of the apps built on fleet (fleet never imports them): each registers its own
#: in its AppConfig.ready(), e.g. refresh's drift and quarantine gauges.
EXTRA_COLLECTORS: list[Collector] = []


def _allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        )
    networks = getattr(settings, "METRICS_ALLOWED_NETWORKS", DEFAULT_ALLOWED)
    try:
        addr = ipaddress.ip_address(client_address(request) or "")
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(n) for n in networks)


class FleetCollector(Collector):
    """Workers, staleness and discovery history per source, read fresh on every scrape."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        names = dict(Source.objects.values_list("pk", "name"))

        workers = GaugeMetricFamily(
            "controlplane_workers", "Workers by source and state.", labels=["source", "state"]
        )
        for row in Worker.objects.values("source_id", "state").annotate(n=Count("id")).order_by():
            workers.add_metric([names[row["source_id"]], row["state"]], row["n"])
        yield workers

        stale = GaugeMetricFamily(
            "controlplane_source_stale",
            "1 when the source's listener failed its last refresh.",
            labels=["source"],
        )
        for name, is_stale in Source.objects.values_list("name", "stale"):
            stale.add_metric([name], int(is_stale))
        yield stale

        runs = GaugeMetricFamily(
            "controlplane_discovery_runs", "Discovery runs kept in history.", labels=["source"]
        )
        errors = GaugeMetricFamily(
            "controlplane_discovery_listener_errors",
            "Refreshes whose listener call failed.",
            labels=["source"],
        )
        history = (
            DiscoveryRun.objects.values("source_id")
            .annotate(
                total=Count("id"),
                failed=Count("id", filter=Q(ok=False)),
                latest=Max("started_at", filter=Q(duration_ms__isnull=False)),
            )
            .order_by()
        )
        latest_started: dict[int, Any] = {}
        for kept in history:
            runs.add_metric([names[kept["source_id"]]], kept["total"])
            errors.add_metric([names[kept["source_id"]]], kept["failed"])
            latest_started[kept["source_id"]] = kept["latest"]
        yield runs
        yield errors

        duration = GaugeMetricFamily(
            "controlplane_discovery_last_duration_seconds",
            "Duration of the latest refresh.",
            labels=["source"],
        )
        latest_runs = DiscoveryRun.objects.filter(
            duration_ms__isnull=False,
            started_at__in=[t for t in latest_started.values() if t is not None],
        ).values_list("source_id", "started_at", "duration_ms")
        for source_id, started_at, duration_ms in latest_runs:
            if duration_ms is not None and latest_started.get(source_id) == started_at:
                duration.add_metric([names[source_id]], duration_ms / 1000.0)
        yield duration
        yield discovery_latency(names)

        yield gate_state_gauge(names)


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def discovery_latency(names: dict[int, str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "controlplane_discovery_duration_seconds",
        f"Discovery run duration over the last {LATENCY_WINDOW_SECONDS}s of runs, by "
        "quantile (1 = the slowest).",
        labels=["source", "quantile"],
    )
    since = timezone.now() - timedelta(seconds=LATENCY_WINDOW_SECONDS)
    durations: dict[int, list[float]] = {}
    recent = DiscoveryRun.objects.filter(started_at__gte=since, duration_ms__isnull=False)
    for source_id, duration_ms in recent.values_list("source_id", "duration_ms"):
        if duration_ms is not None:
            durations.setdefault(source_id, []).append(duration_ms / 1000.0)
    for source_id, values in sorted(durations.items(), key=lambda item: names[item[0]]):
        values.sort()
        for q in LATENCY_QUANTILES:
            family.add_metric([names[source_id], repr(q)], _quantile(values, q))
    return family


def gate_state_gauge(names: dict[int, str]) -> GaugeMetricFamily:
    """Gates by source and state; every state of a source with gates gets a sample (0 too), so
    an alert on `state="unknown"` sees the value fall back instead of the series vanishing."""
    gates = GaugeMetricFamily(
        "controlplane_gates",
        "Gates by source and state (open, open_forced, closed, unknown).",
        labels=["source", "state"],
    )
    gate_model = apps.get_model("refresh", "Gate")
    states = [value for value, _ in gate_model._meta.get_field("state").choices or ()]
    counts: dict[int, dict[str, int]] = {}
    for row in gate_model.objects.values("source_id", "state").annotate(n=Count("id")).order_by():
        counts.setdefault(row["source_id"], dict.fromkeys(states, 0))[row["state"]] = row["n"]
    for source_id, by_state in sorted(counts.items(), key=lambda item: names[item[0]]):
        for state, n in by_state.items():
            gates.add_metric([names[source_id], state], n)
    return gates


@login_not_required
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        refused = "a valid bearer token" if settings.METRICS_TOKEN else "an allowed address"
        return HttpResponseForbidden(f"metrics are served only to {refused}\n")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    registry.register(NotifyCollector())
    registry.register(AuditCollector())
    for collector in EXTRA_COLLECTORS:
        registry.register(collector)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
