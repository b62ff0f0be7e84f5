"""`/metrics` gauges for drift and quarantine, registered into fleet's endpoint by refresh.

Labels stay low-cardinality: source name, drift kind and quarantine state — never worker ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.fleet.models import Source
from controlplane.refresh.models import OPEN_QUARANTINE_STATES, Gate, Quarantine


class DriftCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        names = dict(Source.objects.values_list("pk", "name"))
        drifted = GaugeMetricFamily(
            "controlplane_drifted_workers",
            "Workers that no longer match their gate's verified policy, by drift kind.",
            labels=["source", "kind"],
        )
        counts: Counter[tuple[str, str]] = Counter()
        for source_id, drift in Gate.objects.values_list("source_id", "drift"):
            for entry in drift:
                counts[(names[source_id], str(entry.get("kind", "")))] += 1
        for (source, kind), n in sorted(counts.items()):
            drifted.add_metric([source, kind], n)
        yield drifted

        quarantined = GaugeMetricFamily(
            "controlplane_quarantined_workers",
            "Drifted workers under quarantine (paused, catching up, failed or released).",
            labels=["source", "state"],
        )
        rows = (
            Quarantine.objects.filter(state__in=OPEN_QUARANTINE_STATES)
            .values("source_id", "state")
            .annotate(n=Count("id"))
            .order_by()
        )
        for row in rows:
            quarantined.add_metric([names[row["source_id"]], row["state"]], row["n"])
        yield quarantined
