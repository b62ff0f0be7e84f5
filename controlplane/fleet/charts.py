"""The fleet's pictures, each from one aggregate query (see controlplane/charts.py for why SVG).

- version distribution per namespace: stacked bars, one per (source,) namespace;
- the fleet map: one cell per present worker, coloured by version (live) or state, linked
  (drawn in the browser from a compact payload: see `FleetMap`);
- discovery latency: the recent discovery runs' durations as a sparkline.

Gone workers are left out of the distribution and the map: they are history, not fleet.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, QuerySet, TextField
from django.db.models.functions import Cast
from django.urls import reverse
from django.utils.safestring import SafeString
from django.utils.text import Truncator

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


@dataclass(frozen=True, slots=True)
class FleetMap:
    """The fleet map's data: one cell per present worker in identity order, as a compact
    payload the page's static script (static/js/fleet_map.js) turns into one link per cell.

    At 10,000 workers an SVG of `<a><rect><title>` per worker was ~1.6 MB and 30,000 nodes to
    parse; this payload is a few hundred KB of numbers and indexes, and the browser builds one
    small element per cell. `cells` is flat, `CELL_FIELDS` numbers or strings per worker:
    worker pk, index into `prefixes` (`namespace/component/endpoint/`), instance id, index into
    `states`, into `versions` and into `classes` (colour: the version's for a live worker, the
    state's otherwise). The tooltip the script builds is `worker_key · state · version`.
    """

    count: int
    payload: dict[str, Any]
    summary: str
    legend: dict[str, str]

    @property
    def json(self) -> str:
        """The payload as JSON text, plain `str`: the template escapes it into an attribute
        (htmx drops `<script>` elements from swapped HTML, data ones included)."""
        return json.dumps(self.payload, separators=(",", ":"))

    def as_data(self) -> dict[str, Any]:
        """What the source page's map fetches (`views.source_map_data`): the payload with the
        summary sentence and the legend the fragment renders, names shortened as it does."""
        legend = [[Truncator(name).chars(LEGEND_CHARS), cls] for name, cls in self.legend.items()]
        return {**self.payload, "count": self.count, "summary": self.summary, "legend": legend}


#: A legend entry's most characters (a version can be a long path), as `truncatechars`.
LEGEND_CHARS = 40
#: Values per cell in `FleetMap.payload["cells"]`; the script reads the same stride.
CELL_FIELDS = 6


def _position(at: dict[str, int], values: list[str], value: str) -> int:
    """Position of `value` in `values`, appended the first time it is seen."""
    if value not in at:
        at[value] = len(values)
        values.append(value)
    return at[value]


def fleet_map(source: Source) -> FleetMap:
    """One cell per present worker in identity order: a single query, whatever the size."""
    # The version as its JSON text, decoded once per distinct value: decoding it per row
    # (the JSON field's converter) was the largest cost of the map at 10,000 workers.
    rows = list(
        _present(source.workers.all())
        .order_by("namespace", "component", "endpoint", "instance_id")
        .values_list(
            "pk",
            "namespace",
            "component",
            "endpoint",
            "instance_id",
            "state",
            Cast("weight_version", TextField()),
        )
    )
    label_of: dict[str | None, str] = {}
    for *_, raw in rows:
        if raw not in label_of:
            label_of[raw] = version_label(None if raw is None else json.loads(raw))
    by_version = Counter(label_of[r[6]] for r in rows)
    classes = version_classes(by_version)
    prefixes: list[str] = []
    states: list[str] = []
    versions: list[str] = []
    colours: list[str] = []
    prefix_at: dict[tuple[str, str, str], int] = {}
    state_at: dict[str, int] = {}
    version_at: dict[str, int] = {}
    colour_at: dict[str, int] = {}
    # Per distinct (state, version): its state's, version's and colour's positions.
    kind_at: dict[tuple[str, str | None], tuple[int, int, int]] = {}
    cells: list[int | str] = []
    live: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for pk, ns, comp, ep, iid, state, raw in rows:
        prefix = prefix_at.get((ns, comp, ep))
        if prefix is None:
            prefix = prefix_at[(ns, comp, ep)] = len(prefixes)
            prefixes.append(worker_key(ns, comp, ep, ""))
        kind = kind_at.get((state, raw))
        if kind is None:
            label = label_of[raw]
            colour = classes[label] if state == WorkerState.LIVE else f"chart-{state}"
            kind = kind_at[(state, raw)] = (
                _position(state_at, states, state),
                _position(version_at, versions, label),
                _position(colour_at, colours, colour),
            )
        if state == WorkerState.LIVE:
            live[versions[kind[1]]] += 1
        else:
            other[state] += 1
        cells += (pk, prefix, iid, *kind)
    # One reverse() for the pattern, not one per cell.
    marker = 987654321
    href = reverse("fleet:worker", args=[marker]).replace(str(marker), "{}")
    payload = {
        "href": href,
        "prefixes": prefixes,
        "states": states,
        "versions": versions,
        "classes": colours,
        "cells": cells,
    }
    return FleetMap(
        count=len(rows),
        payload=payload,
        summary=_map_summary(len(rows), live, other, classes),
        legend=dict(classes) | {"erroring": "chart-erroring"},
    )


def _map_summary(
    count: int, live: Counter[str], other: Counter[str], classes: dict[str, str]
) -> str:
    """The map as a sentence, for people who do not see it: counts per version and state."""
    if not count:
        return "No workers."
    parts = [f"{live.total():,} live"]
    if live:
        parts[0] += " (" + ", ".join(f"{v}: {live[v]:,}" for v in classes if live[v]) + ")"
    parts += [f"{n:,} {state}" for state, n in sorted(other.items())]
    return f"{count:,} workers: " + ", ".join(parts) + "."


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
