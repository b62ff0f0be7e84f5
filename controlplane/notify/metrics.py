"""`/metrics` families for outbound notifications (registered by fleet/metrics.py).

Deliveries by destination and status (pending and retrying are the backlog, failed ones gave
up), and attempts by result. Both count the rows kept; destination names are few and chosen by
operators, so they make fine labels.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.notify.models import DeliveryStatus, NotificationAttempt, NotificationDelivery


class NotifyCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        deliveries = GaugeMetricFamily(
            "controlplane_notification_deliveries",
            "Notification deliveries kept, by destination and status.",
            labels=["destination", "status"],
        )
        counts: dict[str, dict[str, int]] = {}
        rows = (
            NotificationDelivery.objects.values("destination__name", "status")
            .annotate(n=Count("id"))
            .order_by()
        )
        for row in rows:
            per = counts.setdefault(
                row["destination__name"], dict.fromkeys(DeliveryStatus.values, 0)
            )
            per[row["status"]] = row["n"]
        for destination, per in sorted(counts.items()):
            for status, n in per.items():
                deliveries.add_metric([destination, status], n)
        yield deliveries

        attempts = CounterMetricFamily(
            "controlplane_notification_attempts",
            "HTTP attempts to deliver notifications, by destination and result (ok, failed).",
            labels=["destination", "result"],
        )
        attempt_rows = (
            NotificationAttempt.objects.values("delivery__destination__name", "ok")
            .annotate(n=Count("id"))
            .order_by("delivery__destination__name", "ok")
        )
        for attempt in attempt_rows:
            result = "ok" if attempt["ok"] else "failed"
            attempts.add_metric([attempt["delivery__destination__name"], result], attempt["n"])
        yield attempts
