"""`/metrics` counters read from the audit log: events that matter on a dashboard, by action.

The audit log is append-only and never purged, so a count of its rows is a true counter across
every process and restart (drift found, quarantines, holds, webhooks accepted or rejected,
failed sign-ins). Only the actions below are counted, each through the (action, sequence)
index, so a scrape does not read the whole log.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent

COUNTED_ACTIONS = (
    AuditAction.GATE_DRIFT_RECORDED,
    AuditAction.GATE_RECONCILED,
    AuditAction.QUARANTINE_STARTED,
    AuditAction.QUARANTINE_ADMITTED,
    AuditAction.QUARANTINE_FAILED,
    AuditAction.POLICY_REFRESH_STARTED,
    AuditAction.POLICY_REFRESH_HELD,
    AuditAction.POLICY_REFRESH_RETRIED,
    AuditAction.POLICY_REFRESH_ROLLED_BACK,
    AuditAction.GATE_FORCE_REOPENED,
    AuditAction.WEBHOOK_ACCEPTED,
    AuditAction.WEBHOOK_REJECTED,
    AuditAction.WEBHOOK_REPLAYED,
    AuditAction.LOGIN_SUCCEEDED,
    AuditAction.LOGIN_FAILED,
    AuditAction.SOURCE_WENT_STALE,
)


class AuditCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "controlplane_audit_events",
            "Audited events by action (drift, quarantine, holds, webhooks, sign-ins, ...).",
            labels=["action"],
        )
        counts = dict.fromkeys((a.value for a in COUNTED_ACTIONS), 0)
        rows = (
            AuditEvent.objects.filter(action__in=counts)
            .values("action")
            .annotate(n=Count("id"))
            .order_by()
        )
        for row in rows:
            counts[row["action"]] = row["n"]
        for action, n in counts.items():
            family.add_metric([action], n)
        yield family
