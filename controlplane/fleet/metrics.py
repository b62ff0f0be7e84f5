"""`/metrics`: Prometheus text computed from the database at scrape time.

Labels stay low-cardinality: source name and worker state only — never worker ids or
versions. Access is limited to `METRICS_ALLOWED_NETWORKS` (default: loopback), since the page
is unauthenticated for scrapers.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.http import require_GET

from controlplane.fleet.models import DiscoveryRun, Source, Worker

DEFAULT_ALLOWED = ("127.0.0.1/32", "::1/128")


def _allowed(request: HttpRequest) -> bool:
    networks = getattr(settings, "METRICS_ALLOWED_NETWORKS", DEFAULT_ALLOWED)
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(n) for n in networks)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@login_not_required
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return HttpResponseForbidden("metrics are not served to this address\n")
    names = dict(Source.objects.values_list("pk", "name"))
    lines = [
        "# HELP controlplane_workers Workers by source and state.",
        "# TYPE controlplane_workers gauge",
    ]
    for row in Worker.objects.values("source_id", "state").annotate(n=Count("id")).order_by():
        lines.append(
            f'controlplane_workers{{source="{_escape(names[row["source_id"]])}",'
            f'state="{row["state"]}"}} {row["n"]}'
        )
    lines += [
        "# HELP controlplane_source_stale 1 when the source's listener failed its last refresh.",
        "# TYPE controlplane_source_stale gauge",
    ]
    for source in Source.objects.only("name", "stale"):
        lines.append(
            f'controlplane_source_stale{{source="{_escape(source.name)}"}} {int(source.stale)}'
        )
    runs = (
        DiscoveryRun.objects.values("source_id")
        .annotate(total=Count("id"), failed=Count("id", filter=Q(ok=False)))
        .order_by()
    )
    lines += [
        "# HELP controlplane_discovery_runs Discovery refreshes kept in history.",
        "# TYPE controlplane_discovery_runs gauge",
        "# HELP controlplane_discovery_listener_errors Refreshes whose listener call failed.",
        "# TYPE controlplane_discovery_listener_errors gauge",
    ]
    for row in runs:
        label = _escape(names[row["source_id"]])
        lines.append(f'controlplane_discovery_runs{{source="{label}"}} {row["total"]}')
        lines.append(f'controlplane_discovery_listener_errors{{source="{label}"}} {row["failed"]}')
    lines += [
        "# HELP controlplane_discovery_last_duration_seconds Duration of the latest refresh.",
        "# TYPE controlplane_discovery_last_duration_seconds gauge",
    ]
    for pk, name in names.items():  # sources are few; one indexed lookup each
        duration = (
            DiscoveryRun.objects.filter(source_id=pk, duration_ms__isnull=False)
            .order_by("-started_at")
            .values_list("duration_ms", flat=True)
            .first()
        )
        if duration is not None:
            lines.append(
                f'controlplane_discovery_last_duration_seconds{{source="{_escape(name)}"}} '
                f"{duration / 1000.0:.6f}"
            )
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain; version=0.0.4")
