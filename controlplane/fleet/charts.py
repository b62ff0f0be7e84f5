"""The fleet's pictures, each from one aggregate query (see controlplane/charts.py for why SVG).

- version distribution per namespace: stacked bars, one per (source,) namespace;
- the fleet map: one cell per present worker, coloured by version (live) or state, linked;
- discovery latency: the recent discovery runs' durations as a sparkline.

Gone workers are left out of the distribution and the map: they are history, not fleet.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from django.db.models import Count, QuerySet
from django.urls import reverse
from django.utils.safestring import SafeString

from controlplane import charts
from controlplane.dynamo.discovery import worker_key
from controlplane.fleet.models import DiscoveryRun, Source, Worker, WorkerState
from controlplane.fleet.presenters import version_label

#: Discovery runs the latency sparkline shows.
LATENCY_RUNS = 40


def _present(workers: QuerySet[Worker]) -> QuerySet[Worker]:
    return workers.exclude(state=WorkerState.GONE)


def version_classes(counts: Counter[str]) -> dict[str, str]:
    """Versions → series colour, most common first, so the same chart reads the same way."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return {label: charts.series_class(i) for i, (label, _) in enumerate(ordered)}


def version_chart(sources: QuerySet[Source] | list[Source], *, by_source: bool) -> SafeString:
    """Stacked bars of weight versions per namespace (per source too on the overview)."""
    rows = (
        _present(Worker.objects.filter(source__in=sources))
        .values("source__name", "namespace", "weight_version")
        .annotate(n=Count("id"))
        .order_by("source__name", "namespace")
    )
    per_row: dict[str, Counter[str]] = defaultdict(Counter)
    overall: Counter[str] = Counter()
    for r in rows:
        name = f"{r['source__name']} / {r['namespace']}" if by_source else r["namespace"]
        label = version_label(r["weight_version"])
        per_row[name][label] += r["n"]
        overall[label] += r["n"]
    classes = version_classes(overall)
    stacked = [
        charts.StackedRow(
            name,
            [charts.Segment(v, n, classes[v]) for v, n in sorted(c.items(), key=_by(classes))],
        )
        for name, c in per_row.items()
    ]
    return charts.stacked_bars(stacked, label="Weight versions per namespace")


def _by(classes: dict[str, str]):
    order = {label: i for i, label in enumerate(classes)}
    return lambda item: order[item[0]]


def fleet_map(source: Source) -> SafeString:
    """One cell per present worker in identity order: a single query, whatever the size."""
    rows = list(
        _present(source.workers.all())
        .order_by("namespace", "component", "endpoint", "instance_id")
        .values_list(
            "pk", "namespace", "component", "endpoint", "instance_id", "state", "weight_version"
        )
    )
    classes = version_classes(Counter(version_label(r[6]) for r in rows))
    # One reverse() for the pattern, not one per cell: 2,000 reverses cost more than the query.
    marker = 987654321
    href = reverse("fleet:worker", args=[marker]).replace(str(marker), "{}")
    cells = []
    for pk, ns, comp, ep, iid, state, version in rows:
        label = version_label(version)
        cls = classes[label] if state == WorkerState.LIVE else f"chart-{state}"
        title = f"{worker_key(ns, comp, ep, iid)} · {state} · {label}"
        cells.append(charts.Cell(title, cls, href.format(pk)))
    legend = dict(classes) | {"erroring": "chart-erroring"}
    return charts.cell_map(cells, label=f"Fleet map: {len(cells)} workers", legend=legend)


def discovery_latency(source: Source) -> SafeString:
    """The last discovery runs' durations, oldest first; failed runs are titled as such."""
    runs = list(
        DiscoveryRun.objects.filter(source=source, duration_ms__isnull=False)
        .order_by("-started_at")
        .values_list("started_at", "duration_ms", "ok", "trigger")[:LATENCY_RUNS]
    )
    points = [
        (
            f"{started:%Y-%m-%d %H:%M:%S} UTC · {ms:.0f} ms · {trigger}"
            + ("" if ok else " · failed"),
            float(ms or 0),
        )
        for started, ms, ok, trigger in reversed(runs)
    ]
    return charts.sparkline(points, label="Discovery latency, recent runs")
