"""Prometheus histograms computed in the database at scrape time (see fleet/metrics.py).

One aggregate query per histogram: a conditional count per bucket bound, the sum and the count,
grouped by the label columns. The rows are the truth whichever process wrote them, so every
web replica answers a scrape with the same figures and nothing is kept per process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from django.db.models import Count, Q, QuerySet, Sum
from prometheus_client.core import HistogramMetricFamily

#: Seconds: from a quick admin call to a long weight load.
STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def histogram(
    name: str,
    documentation: str,
    rows: QuerySet,
    *,
    label_fields: Sequence[str],
    label_names: Sequence[str],
    value_field: str,
    buckets: Iterable[float],
    scale: float = 1.0,
    label_values: Callable[[dict], list[str]] | None = None,
) -> HistogramMetricFamily:
    """A histogram of `value_field` (multiplied by `scale`, e.g. 0.001 for milliseconds)
    over `rows`, one series per distinct `label_fields` (named `label_names`; turned into
    label values by `label_values`, default: the fields as text)."""
    bounds = list(buckets)
    family = HistogramMetricFamily(name, documentation, labels=list(label_names))
    aggregates = {
        f"le_{i}": Count("pk", filter=Q(**{f"{value_field}__lte": bound / scale}))
        for i, bound in enumerate(bounds)
    }
    grouped = (
        rows.filter(**{f"{value_field}__isnull": False})
        .values(*label_fields)
        .annotate(total=Count("pk"), value_sum=Sum(value_field), **aggregates)
        .order_by(*label_fields)
    )
    for row in grouped:
        labels = label_values(row) if label_values else [str(row[f]) for f in label_fields]
        cumulative = [(_le(bound), row[f"le_{i}"]) for i, bound in enumerate(bounds)]
        cumulative.append(("+Inf", row["total"]))
        family.add_metric(labels, cumulative, (row["value_sum"] or 0.0) * scale)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))
