"""`/metrics` family for trainer webhook deliveries, registered into fleet's endpoint.

Received (signed) webhooks kept, by endpoint, state and outcome: the backlog (queued, retrying,
retryable) and how the done ones ended. Rejected and replayed requests are never stored; they
are counted from the audit log (`controlplane_audit_events_total{action="webhook.rejected"}`).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.intake.models import ReceivedWebhook


class WebhookCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "controlplane_webhook_deliveries",
            "Signed trainer webhooks kept, by endpoint, state and outcome.",
            labels=["endpoint", "state", "outcome"],
        )
        rows = (
            ReceivedWebhook.objects.values("endpoint__name", "state", "outcome")
            .annotate(n=Count("id"))
            .order_by("endpoint__name", "state", "outcome")
        )
        for row in rows:
            family.add_metric([row["endpoint__name"], row["state"], row["outcome"]], row["n"])
        yield family
